// `tsnap bench`: checkpoint throughput, like fio for snapshots. Builds a state shaped like real
// training state, then runs interleaved repetitions of
//   raw      sequential write (+ fsync) and read of an equal-size file through an io engine of
//            the snapshotter's kind, chunk size and queue depth, no staging: the device's limit;
//   memcpy   a 2-thread memcpy of the output bytes: the floor of the stall;
//   tsnap    save_async + wait (stall, durable time, GB/s, process CPU time), then tsnap::load
//            of the snapshot just written (warm page cache);
//   torch    torch::save + fsync and torch::load (warm) of the same tensors;
// for each value of an optional swept parameter, and prints a table with ratios (or JSON / CSV),
// optionally a gnuplot PNG. With --timeline it instead simulates a training loop and gives the
// per-step time without and with snapshots every N steps (see run_timeline). Everything it writes
// lives in one directory under --dir that is removed on every way out.

#include <sys/statvfs.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/output.h"
#include "common/remove_tree.h"
#include "measure.h"
#include "tsnap/load.h"
#include "tsnap/snapshotter.h"
#include "workloads.h"

namespace tsnap::cli {
namespace {

namespace fs = std::filesystem;
using bench::Clock;
using bench::Series;

struct BenchOptions {
  std::string preset = "gpt2-small";
  double size = 1.0;
  int tensors = 0;
  std::string dtype = "f32";
  int threads = 0;
  std::string chunk = "16M";
  unsigned depth = 32;
  std::string engine = "auto";
  std::string direct = "on";
  std::string budget = "auto";  // the whole snapshot, so that the stall is the staging copy
  bool lazy = false;
  int reps = 3;
  std::string dir = ".";
  bool no_torch = false;
  bool no_restore = false;
  bool json = false;
  bool csv = false;
  std::string sweep;
  std::string plot;
  bool timeline = false;
  int steps = 60;
  int every = 10;
  double step_ms = 100;
};

// "4096", "64K", "16M", "1G" (binary multiples). Throws std::invalid_argument.
uint64_t parse_size(const std::string& text) {
  size_t used = 0;
  const double v = std::stod(text, &used);
  std::string unit = text.substr(used);
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();
  if (!unit.empty() && (unit.back() == 'i')) unit.pop_back();
  double mult = 1;
  if (unit == "K" || unit == "k")
    mult = 1024.0;
  else if (unit == "M" || unit == "m")
    mult = 1048576.0;
  else if (unit == "G" || unit == "g")
    mult = 1073741824.0;
  else if (!unit.empty())
    throw std::invalid_argument("bad unit");
  if (!(v > 0) || !std::isfinite(v)) throw std::invalid_argument("not positive");
  return static_cast<uint64_t>(v * mult);
}

std::string check_chunk(const std::string& text) {
  try {
    const uint64_t n = parse_size(text);
    if (n % 4096 != 0) return "chunk size must be a multiple of 4096: " + text;
    return "";
  } catch (const std::exception&) {
    return "bad size '" + text + "' (e.g. 4096, 64K, 16M, 1G)";
  }
}

std::string check_size(const std::string& text) {
  try {
    parse_size(text);
    return "";
  } catch (const std::exception&) {
    return "bad size '" + text + "' (e.g. 4096, 64K, 16M, 1G)";
  }
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, sep)) out.push_back(item);
  return out;
}

struct Sweep {
  std::string param;  // "" when none
  std::vector<std::string> values;
};

// "threads=1,2" | "chunk=4M,16M" | "depth=8,32" | "budget=256M,1G". Throws std::invalid_argument.
Sweep parse_sweep(const std::string& text) {
  Sweep s;
  if (text.empty()) return s;
  const size_t eq = text.find('=');
  if (eq == std::string::npos) throw std::invalid_argument("expected PARAM=V1,V2,...");
  s.param = text.substr(0, eq);
  s.values = split(text.substr(eq + 1), ',');
  if (s.values.empty()) throw std::invalid_argument("no values");
  for (const std::string& v : s.values) {
    std::string why;
    if (s.param == "threads" || s.param == "depth") {
      size_t used = 0;
      const long n = std::stol(v, &used);
      if (used != v.size() || n < (s.param == "threads" ? 0 : 1)) {
        throw std::invalid_argument("bad value '" + v + "'");
      }
    } else if (s.param == "chunk") {
      why = check_chunk(v);
    } else if (s.param == "budget") {
      why = check_size(v);
    } else {
      throw std::invalid_argument("unknown parameter '" + s.param +
                                  "' (threads, chunk, depth, budget)");
    }
    if (!why.empty()) throw std::invalid_argument(why);
  }
  return s;
}

std::optional<at::ScalarType> dtype_of(const std::string& name) {
  if (name == "bf16") return at::kBFloat16;
  if (name == "f16") return at::kHalf;
  return std::nullopt;  // f32: the states are fp32
}

StateDict make_state(const BenchOptions& o, std::string* description) {
  if (o.tensors > 0) {
    const uint64_t bytes = static_cast<uint64_t>(o.size * 1073741824.0);
    *description = std::to_string(o.tensors) + " equal fp32 tensors";
    return bench::large_tensors(bytes, o.tensors);
  }
  if (o.preset == "small-tensors") {
    const int n = std::max(1, static_cast<int>(10000 * o.size));
    *description = std::to_string(n) + " small fp32 tensors (4-64 KiB)";
    return bench::small_tensors(n);
  }
  if (o.preset == "llama-1b") {
    *description =
        "Llama-1B-like + Adam moments (scale " + std::to_string(o.size).substr(0, 4) + ")";
    return bench::llama_1b_with_adam(o.size);
  }
  StateDict sd = bench::gpt2_small_with_adam(o.size);
  *description = "GPT-2 small + Adam moments (scale " + std::to_string(o.size).substr(0, 4) + ")";
  if (o.preset == "mixed") {
    const int n = std::max(1, static_cast<int>(2000 * o.size));
    for (auto& [k, e] : bench::small_tensors(n)) sd.insert(k, e.tensor);
    *description += " + " + std::to_string(n) + " small tensors";
  }
  return sd;
}

// Runs `fn` when it goes out of scope (also on an exception).
class ScopeGuard {
 public:
  explicit ScopeGuard(std::function<void()> fn) : fn_(std::move(fn)) {}
  ~ScopeGuard() {
    if (fn_) fn_();
  }
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;

 private:
  std::function<void()> fn_;
};

// The progress line on stderr: rewritten in place on a terminal, one line each otherwise.
class Progress {
 public:
  Progress() : tty_(::isatty(STDERR_FILENO) != 0) {}
  void show(const std::string& text) {
    if (tty_) {
      std::cerr << "\r\033[K" << text << std::flush;
    } else {
      std::cerr << text << '\n';
    }
  }
  void done() {
    if (tty_) std::cerr << "\r\033[K" << std::flush;
  }

 private:
  bool tty_;
};

// One measured quantity: seconds per repetition and the bytes each repetition moved.
struct Measure {
  std::string key;    // for JSON / CSV
  std::string label;  // for the table
  Series s;
  double bytes = 0;
  double gbps() const { return s.empty() || s.median() <= 0 ? 0 : bytes / s.median() / 1e9; }
};

struct PointResult {
  std::string value;  // the swept parameter's value ("" without a sweep)
  std::string engine;
  std::vector<Measure> m;
  Series cpu_s;  // process CPU seconds during a save (pipeline threads, mostly)
  Measure& get(const std::string& key) {
    for (Measure& x : m) {
      if (x.key == key) return x;
    }
    throw std::logic_error("no measure " + key);
  }
  const Measure* find(const std::string& key) const {
    for (const Measure& x : m) {
      if (x.key == key && !x.s.empty()) return &x;
    }
    return nullptr;
  }
};

std::string fixed(double v, int digits) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(digits) << v;
  return o.str();
}

void apply(const std::string& param, const std::string& value, SnapshotterOptions* so) {
  if (param == "threads") so->stage_threads = std::stoi(value);
  if (param == "depth") so->queue_depth = static_cast<unsigned>(std::stoul(value));
  if (param == "chunk") so->chunk_bytes = parse_size(value);
  if (param == "budget") so->staging_budget_bytes = parse_size(value);
}

SnapshotterOptions snapshotter_options(const BenchOptions& o, const StateDict& state,
                                       const fs::path& work) {
  SnapshotterOptions so;
  so.root = work;
  so.chunk_bytes = parse_size(o.chunk);
  so.staging_budget_bytes =
      o.budget == "auto"
          ? (bench::output_bytes(state, dtype_of(o.dtype)) / so.chunk_bytes + 2) * so.chunk_bytes
          : parse_size(o.budget);
  so.stage_threads = o.threads;
  so.queue_depth = o.depth;
  so.engine = o.engine == "uring"    ? EngineKind::kUring
              : o.engine == "pwrite" ? EngineKind::kPwrite
                                     : EngineKind::kAuto;
  so.direct_io = o.direct == "on";
  so.max_in_flight = 1;
  return so;
}

PointResult run_point(const BenchOptions& o, const Sweep& sweep, size_t index,
                      const StateDict& state, const fs::path& work, uint8_t* floor_buf,
                      Progress& progress) {
  SnapshotterOptions so = snapshotter_options(o, state, work);
  PointResult r;
  if (!sweep.param.empty()) {
    r.value = sweep.values[index];
    apply(sweep.param, r.value, &so);
  }
  Snapshotter snap(so);
  r.engine = snap.engine_name();
  const bool uring = r.engine.rfind("io_uring", 0) == 0;
  const bool direct = r.engine.find("O_DIRECT") != std::string::npos;
  const size_t nbufs = static_cast<size_t>(std::max<uint64_t>(
      2, std::min<uint64_t>(so.queue_depth, so.staging_budget_bytes / so.chunk_bytes)));
  bench::RawIo raw(uring, so.queue_depth, so.chunk_bytes, nbufs);

  const std::optional<at::ScalarType> dtype = dtype_of(o.dtype);
  const double in_bytes = bench::output_bytes(state, std::nullopt);
  const double out_bytes = bench::output_bytes(state, dtype);
  r.m = {{"raw_write", "raw write + fsync", {}, in_bytes},
         {"raw_read", direct ? "raw read (O_DIRECT)" : "raw read (page cache)", {}, in_bytes},
         {"tsnap_save", "tsnap save (durable)", {}, 0},
         {"tsnap_stall", "tsnap stall", {}, out_bytes},
         {"tsnap_stage", "  of which staging", {}, out_bytes},
         {"tsnap_staged", "tsnap call to staged (lazy)", {}, out_bytes},
         {"memcpy", "memcpy 2 threads (stall floor)", {}, out_bytes},
         {"tsnap_load", "tsnap::load (warm cache)", {}, 0},
         {"torch_save", "torch::save + fsync", {}, in_bytes},
         {"torch_load", "torch::load (warm cache)", {}, in_bytes}};

  const std::string point = sweep.param.empty() ? "" : "[" + sweep.param + "=" + r.value + "] ";
  for (int rep = 0; rep < o.reps; ++rep) {
    const std::string at =
        point + "rep " + std::to_string(rep + 1) + "/" + std::to_string(o.reps) + ": ";
    const std::string raw_path = (work / "raw.bin").string();
    progress.show(at + "raw write");
    r.get("raw_write").s.add(raw.write(raw_path, static_cast<uint64_t>(in_bytes), direct, true));
    progress.show(at + "raw read");
    try {
      r.get("raw_read").s.add(raw.read(raw_path, direct));
    } catch (...) {
      fs::remove(raw_path);
      throw;
    }
    fs::remove(raw_path);

    progress.show(at + "tsnap save");
    const std::string name = "snap-" + std::to_string(index) + "-" + std::to_string(rep);
    SaveOptions save;
    save.dtype = dtype;
    save.staging = o.lazy ? Staging::kLazy : Staging::kEager;
    const double cpu0 = bench::process_cpu_s();
    const auto t0 = Clock::now();
    SaveHandle h = snap.save_async(name, state, nlohmann::json::object(), save);
    if (o.lazy) {
      h.wait_staged();  // what the caller waits for before it next changes its tensors
      r.get("tsnap_staged").s.add(bench::since(t0));
    }
    h.wait();
    r.cpu_s.add(bench::process_cpu_s() - cpu0);
    const SaveStats st = h.stats();
    r.get("tsnap_save").s.add(st.total_s);
    r.get("tsnap_save").bytes = st.bytes;
    r.get("tsnap_stall").s.add(st.stall_s);
    r.get("tsnap_stage").s.add(st.stage_s);
    r.get("memcpy").s.add(bench::memcpy_2threads(state, dtype, floor_buf));
    if (!o.no_restore) {
      progress.show(at + "tsnap load");
      const auto t1 = Clock::now();
      const StateDict back = tsnap::load(h.path());
      r.get("tsnap_load").s.add(bench::since(t1));
      r.get("tsnap_load").bytes = st.tensor_bytes;
    }
    detail::remove_tree(h.path().string());

    if (!o.no_torch) {
      const std::string torch_path = (work / "torch.pt").string();
      progress.show(at + "torch::save");
      r.get("torch_save").s.add(bench::torch_save_fsync(state, torch_path, true));
      progress.show(at + "torch::load");
      try {
        r.get("torch_load").s.add(bench::torch_load(torch_path));
      } catch (...) {
        fs::remove(torch_path);
        throw;
      }
      fs::remove(torch_path);
    }
  }
  return r;
}

double ratio(const PointResult& r, const std::string& num, const std::string& den, bool gbps) {
  const Measure* a = r.find(num);
  const Measure* b = r.find(den);
  if (!a || !b) return 0;
  return gbps ? (b->gbps() > 0 ? a->gbps() / b->gbps() : 0)
              : (b->s.median() > 0 ? a->s.median() / b->s.median() : 0);
}

struct Ratio {
  std::string key, label, num, den;
  bool gbps;
};

const std::vector<Ratio>& ratios() {
  static const std::vector<Ratio> list = {
      {"save_vs_raw", "tsnap save GB/s / raw write GB/s", "tsnap_save", "raw_write", true},
      {"stall_vs_memcpy", "tsnap stall / memcpy time", "tsnap_stall", "memcpy", false},
      {"staged_vs_memcpy", "lazy: call to staged / memcpy time", "tsnap_staged", "memcpy", false},
      {"torch_save_vs_save", "torch::save time / tsnap save time", "torch_save", "tsnap_save",
       false},
      {"torch_save_vs_stall", "torch::save time / tsnap stall", "torch_save", "tsnap_stall", false},
      {"load_vs_raw_read", "tsnap::load GB/s / raw read GB/s", "tsnap_load", "raw_read", true},
      {"torch_load_vs_load", "torch::load time / tsnap::load time", "torch_load", "tsnap_load",
       false},
  };
  return list;
}

void print_table(const BenchOptions& o, const Sweep& sweep, const std::string& workload,
                 uint64_t in_bytes, size_t tensors, const std::vector<PointResult>& results) {
  std::cout << "workload: " << workload << ", " << tensors << " tensors, " << human_bytes(in_bytes)
            << " fp32, stored as " << o.dtype << "\n";
  auto opt = [&](const std::string& name, const std::string& value) {
    return sweep.param == name ? std::string("swept") : value;
  };
  std::cout << "options:  engine " << results.front().engine << ", threads "
            << opt("threads", o.threads ? std::to_string(o.threads) : "auto") << ", chunk "
            << opt("chunk", o.chunk) << ", depth " << opt("depth", std::to_string(o.depth))
            << ", budget " << opt("budget", o.budget) << (o.lazy ? ", lazy staging" : "") << ", "
            << o.reps << " reps (median, min..max)\n";
  for (const PointResult& r : results) {
    std::cout << '\n';
    if (!sweep.param.empty()) std::cout << sweep.param << " = " << r.value << ":\n";
    Table table({"MEASURE", "MEDIAN s", "MIN..MAX s", "GB/s"});
    table.set_numeric(1);
    table.set_numeric(3);
    for (const Measure& m : r.m) {
      if (m.s.empty()) continue;
      table.add_row({m.label, fixed(m.s.median(), 3),
                     fixed(m.s.min(), 3) + ".." + fixed(m.s.max(), 3), fixed(m.gbps(), 2)});
    }
    table.print(std::cout);
    std::cout << "ratios:\n";
    for (const Ratio& q : ratios()) {
      const double v = ratio(r, q.num, q.den, q.gbps);
      if (v > 0) std::cout << "  " << std::left << std::setw(40) << q.label << fixed(v, 2) << '\n';
    }
    std::cout << "  process CPU time per save (median)      " << fixed(r.cpu_s.median(), 3)
              << " s\n";
  }
  std::cout << "\npeak RSS " << human_bytes(static_cast<uint64_t>(bench::peak_rss_kib()) * 1024)
            << "; tsnap::load and torch::load read a warm page cache; cold restore: see "
               "bench/restore_bench\n";
}

nlohmann::json series_json(const Measure& m) {
  return {{"median_s", m.s.median()},
          {"min_s", m.s.min()},
          {"max_s", m.s.max()},
          {"reps_s", m.s.v},
          {"bytes", static_cast<uint64_t>(m.bytes)},
          {"gbps", m.gbps()}};
}

void print_json(const BenchOptions& o, const Sweep& sweep, const std::string& workload,
                uint64_t in_bytes, size_t tensors, const std::vector<PointResult>& results) {
  nlohmann::json j;
  j["workload"] = {{"description", workload}, {"tensors", tensors}, {"fp32_bytes", in_bytes}};
  j["options"] = {{"preset", o.tensors ? std::string("custom") : o.preset},
                  {"size", o.size},
                  {"dtype", o.dtype},
                  {"threads", o.threads},
                  {"chunk", o.chunk},
                  {"depth", o.depth},
                  {"engine", o.engine},
                  {"direct", o.direct},
                  {"budget", o.budget},
                  {"lazy", o.lazy},
                  {"reps", o.reps}};
  j["sweep"] = sweep.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(sweep.param);
  j["results"] = nlohmann::json::array();
  for (const PointResult& r : results) {
    nlohmann::json p = {{"value", r.value}, {"engine", r.engine}};
    for (const Measure& m : r.m) {
      if (!m.s.empty()) p["measures"][m.key] = series_json(m);
    }
    for (const Ratio& q : ratios()) {
      const double v = ratio(r, q.num, q.den, q.gbps);
      if (v > 0) p["ratios"][q.key] = v;
    }
    p["cpu_s_per_save"] = r.cpu_s.median();
    j["results"].push_back(p);
  }
  j["peak_rss_bytes"] = static_cast<uint64_t>(bench::peak_rss_kib()) * 1024;
  j["restore_cache"] = "warm";
  std::cout << j.dump(2) << '\n';
}

void print_csv(const Sweep& sweep, const std::vector<PointResult>& results) {
  std::cout << "param,value,measure,median_s,min_s,max_s,bytes,gbps\n";
  for (const PointResult& r : results) {
    for (const Measure& m : r.m) {
      if (m.s.empty()) continue;
      std::cout << sweep.param << ',' << r.value << ',' << m.key << ',' << m.s.median() << ','
                << m.s.min() << ',' << m.s.max() << ',' << static_cast<uint64_t>(m.bytes) << ','
                << m.gbps() << '\n';
    }
  }
}

// Draws GB/s against the swept parameter with gnuplot; the raw device bandwidth is a line.
void plot(const BenchOptions& o, const Sweep& sweep, const std::vector<PointResult>& results,
          const fs::path& work) {
  const fs::path data = work / "plot.dat";
  const fs::path script = work / "plot.gp";
  {
    std::ofstream d(data);
    for (size_t i = 0; i < results.size(); ++i) {
      const PointResult& r = results[i];
      auto g = [&](const char* key) {
        const Measure* m = r.find(key);
        return m ? m->gbps() : NAN;
      };
      d << i << ' ' << (r.value.empty() ? "-" : r.value) << ' ' << g("tsnap_save") << ' '
        << g("raw_write") << ' ' << g("torch_save") << ' ' << g("tsnap_load") << '\n';
    }
  }
  Series raw;
  for (const PointResult& r : results) {
    if (const Measure* m = r.find("raw_write")) raw.add(m->gbps());
  }
  const bool has_torch = results.front().find("torch_save") != nullptr;
  const bool cairo = std::system("gnuplot -e 'set terminal pngcairo' >/dev/null 2>&1") == 0;
  {
    std::ofstream g(script);
    g << "set terminal " << (cairo ? "pngcairo" : "png") << " size 860,420\n"
      << "set output '" << o.plot << "'\n"
      << "set title 'tsnap save throughput (" << (o.tensors ? "custom" : o.preset) << ", "
      << o.dtype << ")'\n"
      << "set xlabel '" << (sweep.param.empty() ? "run" : sweep.param) << "'\n"
      << "set ylabel 'GB/s'\nset yrange [0:*]\nset key outside right top\n"
      << "set grid ytics\nset offsets 0.3,0.3,graph 0.12,0\n"
      << "plot '" << data.string() << "' using 1:3:xtic(2) with linespoints lw 2 pt 7 title "
      << "'tsnap save (durable)', "
      << (has_torch ? "'' using 1:5 with linespoints pt 5 title 'torch::save + fsync', " : "")
      << raw.median() << " with lines dt 2 lw 2 title 'raw write (median " << fixed(raw.median(), 2)
      << " GB/s)'\n";
  }
  const std::string cmd = "gnuplot '" + script.string() + "'";
  if (std::system(cmd.c_str()) != 0) {
    throw std::runtime_error("gnuplot failed to draw " + o.plot +
                             " (is gnuplot installed? scripts/install-deps.sh)");
  }
}

// --timeline: a simulated training loop on the workload state, run twice (without snapshots, then
// with save_async every --every steps), recording each step's wall time and the stall of the
// snapshot steps. A step is "compute" (in-place mul_/add_ passes over scratch copies of some of
// the state's tensors, standing for forward/backward and the gradients: the state itself is left
// alone, so a lazy save may stage while it runs) and then an "optimizer step" that changes every
// floating tensor of the state in place, so each snapshot must be point-in-time exact. The
// number of compute passes is calibrated in warm-up steps so that a step takes about --step-ms.
struct StepRecord {
  double without_s = 0;
  double with_s = 0;
  double stall_s = 0;      // save_async + wait_staged (lazy) inside this step
  bool snapshot = false;   // a save started at the end of this step
  bool in_flight = false;  // a save was still writing when this step ended
};

struct SaveRecord {
  std::string name;
  int step = 0;
  double stall_s = 0;  // save_async + wait_staged, wherever they fell
  double durable_s = 0;
  uint64_t bytes = 0;
};

struct Timeline {
  std::string engine;
  int passes = 0;
  uint64_t scratch_bytes = 0;
  double pass_ms = 0;
  double optimizer_ms = 0;
  std::vector<StepRecord> steps;
  std::vector<SaveRecord> saves;
  double mean(bool with) const {
    double t = 0;
    for (const StepRecord& s : steps) t += with ? s.with_s : s.without_s;
    return steps.empty() ? 0 : t / static_cast<double>(steps.size());
  }
  double overhead_pct() const { return mean(false) > 0 ? (mean(true) / mean(false) - 1) * 100 : 0; }
  double max_stall() const {
    double m = 0;
    for (const SaveRecord& s : saves) m = std::max(m, s.stall_s);
    return m;
  }
};

class TrainSim {
 public:
  TrainSim(const StateDict& state, double step_ms) {
    constexpr uint64_t kScratchMax = 32ull << 20;
    for (const auto& [key, e] : state) {
      if (!e.tensor.is_floating_point()) continue;
      params_.push_back(e.tensor);
      if (scratch_bytes_ < kScratchMax) {
        scratch_.push_back(e.tensor.detach().clone());
        scratch_bytes_ += e.tensor.nbytes();
      }
    }
    // Calibrate: time single passes and optimizer steps, then size the compute.
    Series pass, opt;
    for (int i = 0; i < 5; ++i) {
      auto t0 = Clock::now();
      compute_pass();
      pass.add(bench::since(t0));
      t0 = Clock::now();
      optimizer_step();
      opt.add(bench::since(t0));
    }
    pass_ms_ = pass.median() * 1e3;
    optimizer_ms_ = opt.median() * 1e3;
    passes_ = std::max(
        1, static_cast<int>(std::lround((step_ms - optimizer_ms_) / std::max(pass_ms_, 1e-3))));
  }
  void compute() {
    for (int i = 0; i < passes_; ++i) compute_pass();
  }
  void optimizer_step() {
    for (at::Tensor& t : params_) t.add_(1e-3);
  }
  // Scales the compute so that a step measured at `measured_ms` takes about `target_ms`.
  void rescale(double target_ms, double measured_ms) {
    const double compute_ms = measured_ms - optimizer_ms_;
    if (compute_ms <= 0) return;
    passes_ = std::max(
        1, static_cast<int>(std::lround(passes_ * (target_ms - optimizer_ms_) / compute_ms)));
  }
  int passes() const { return passes_; }
  uint64_t scratch_bytes() const { return scratch_bytes_; }
  double pass_ms() const { return pass_ms_; }
  double optimizer_ms() const { return optimizer_ms_; }

 private:
  void compute_pass() {
    for (at::Tensor& g : scratch_) g.mul_(0.999).add_(1e-6);
  }
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> scratch_;
  uint64_t scratch_bytes_ = 0;
  int passes_ = 1;
  double pass_ms_ = 0, optimizer_ms_ = 0;
};

Timeline run_timeline(const BenchOptions& o, const StateDict& state, const fs::path& work,
                      Progress& progress) {
  // Built first, so that both runs see its threads and pre-faulted staging pool.
  Snapshotter snap(snapshotter_options(o, state, work));
  progress.show("timeline: calibrating the step...");
  TrainSim sim(state, o.step_ms);
  Timeline tl;
  tl.engine = snap.engine_name();
  tl.scratch_bytes = sim.scratch_bytes();
  tl.pass_ms = sim.pass_ms();
  tl.optimizer_ms = sim.optimizer_ms();
  tl.steps.resize(static_cast<size_t>(o.steps));
  for (int round = 0; round < 2; ++round) {  // refine on whole steps, then they are warm
    Series step;
    for (int i = 0; i < 3; ++i) {
      const auto t0 = Clock::now();
      sim.compute();
      sim.optimizer_step();
      step.add(bench::since(t0));
    }
    sim.rescale(o.step_ms, step.median() * 1e3);
  }
  tl.passes = sim.passes();

  for (int i = 0; i < o.steps; ++i) {
    if (i % 10 == 0) {
      progress.show("timeline: without snapshots, step " + std::to_string(i + 1) + "/" +
                    std::to_string(o.steps));
    }
    const auto t0 = Clock::now();
    sim.compute();
    sim.optimizer_step();
    tl.steps[static_cast<size_t>(i)].without_s = bench::since(t0);
  }

  for (int i = 0; i < 2; ++i) {  // the same warm-up before each run
    sim.compute();
    sim.optimizer_step();
  }
  SaveOptions save;
  save.dtype = dtype_of(o.dtype);
  save.staging = o.lazy ? Staging::kLazy : Staging::kEager;
  save.overwrite = true;
  std::vector<SaveHandle> handles;  // one per tl.saves entry
  SaveHandle current;               // the newest save
  SaveHandle previous;              // the one before: removed once `current` commits
  SaveHandle stale;                 // one older still there when a save starts
  bool staged = true;               // lazy: whether `current` was waited staged
  auto retire = [&]() {  // keep only the newest committed snapshot (outside the timed steps)
    if (previous.valid() && current.done()) {
      previous.wait();
      detail::remove_tree(previous.path().string());
      previous = SaveHandle();
    }
  };
  for (int i = 0; i < o.steps; ++i) {
    if (i % 10 == 0) {
      progress.show("timeline: with snapshots every " + std::to_string(o.every) + ", step " +
                    std::to_string(i + 1) + "/" + std::to_string(o.steps));
    }
    StepRecord& rec = tl.steps[static_cast<size_t>(i)];
    const auto t0 = Clock::now();
    sim.compute();
    if (!staged) {  // lazy: the tensors are about to change
      const auto ts = Clock::now();
      current.wait_staged();
      const double s = bench::since(ts);
      rec.stall_s += s;
      tl.saves.back().stall_s += s;
      staged = true;
    }
    sim.optimizer_step();
    if ((i + 1) % o.every == 0) {
      const std::string name = "step-" + std::to_string(i + 1);
      const auto ts = Clock::now();
      SaveHandle h = snap.save_async(name, state, nlohmann::json{{"step", i + 1}}, save);
      const double s = bench::since(ts);
      rec.stall_s += s;
      rec.snapshot = true;
      if (current.valid()) {
        if (previous.valid()) stale = previous;  // removed after the step's time is taken
        previous = current;
      }
      current = h;
      handles.push_back(h);
      staged = !o.lazy;
      tl.saves.push_back({name, i + 1, s, 0, 0});
    }
    rec.with_s = bench::since(t0);
    rec.in_flight = current.valid() && !current.done();
    if (stale.valid()) {
      stale.wait();
      detail::remove_tree(stale.path().string());
      stale = SaveHandle();
    }
    retire();
  }
  if (!staged) {  // the last save's staging, after the last step (counted in its stall)
    const auto ts = Clock::now();
    current.wait_staged();
    tl.saves.back().stall_s += bench::since(ts);
  }
  if (current.valid()) current.wait();
  retire();
  for (size_t k = 0; k < handles.size(); ++k) {
    handles[k].wait();
    const SaveStats st = handles[k].stats();
    tl.saves[k].durable_s = st.total_s;
    tl.saves[k].bytes = st.bytes;
  }
  if (current.valid()) {
    detail::remove_tree(current.path().string());
  }
  return tl;
}

std::string ms(double s) { return fixed(s * 1e3, 1); }

void print_timeline_table(const BenchOptions& o, const std::string& workload, uint64_t in_bytes,
                          size_t tensors, const Timeline& tl) {
  std::cout << "workload: " << workload << ", " << tensors << " tensors, " << human_bytes(in_bytes)
            << " fp32, stored as " << o.dtype << "\n";
  std::cout << "timeline: " << o.steps << " steps of ~" << fixed(o.step_ms, 0)
            << " ms (compute: " << tl.passes << " passes of " << fixed(tl.pass_ms, 2) << " ms over "
            << human_bytes(tl.scratch_bytes) << " of scratch; optimizer step "
            << fixed(tl.optimizer_ms, 2) << " ms over the whole state), snapshot every " << o.every
            << " steps, engine " << tl.engine << (o.lazy ? ", lazy staging" : ", eager staging")
            << "\n";
  if (tl.optimizer_ms >= o.step_ms) {
    std::cout << "note: the optimizer step alone takes longer than --step-ms; steps are longer\n";
  }
  std::cout << '\n';
  Table table({"STEP", "WITHOUT ms", "WITH ms", "STALL ms", ""});
  for (size_t c = 0; c < 4; ++c) table.set_numeric(c);
  for (size_t i = 0; i < tl.steps.size(); ++i) {
    const StepRecord& s = tl.steps[i];
    std::string mark;
    if (s.snapshot) mark = "snapshot";
    if (s.in_flight) mark += mark.empty() ? "(writing)" : " (writing)";
    table.add_row({std::to_string(i + 1), ms(s.without_s), ms(s.with_s),
                   s.stall_s > 0 ? fixed(s.stall_s * 1e3, 2) : "", mark});
  }
  table.print(std::cout);
  std::cout << "\nsaves:\n";
  Table saves({"NAME", "STALL ms", "DURABLE s", "SIZE"});
  saves.set_numeric(1);
  saves.set_numeric(2);
  saves.set_numeric(3);
  for (const SaveRecord& r : tl.saves) {
    saves.add_row({r.name, fixed(r.stall_s * 1e3, 2), fixed(r.durable_s, 3), human_bytes(r.bytes)});
  }
  saves.print(std::cout);
  std::cout << "\nmean step time: " << ms(tl.mean(false)) << " ms without snapshots, "
            << ms(tl.mean(true)) << " ms with (overhead " << fixed(tl.overhead_pct(), 2)
            << "%); max stall " << fixed(tl.max_stall() * 1e3, 2) << " ms\n";
}

void print_timeline_json(const BenchOptions& o, const std::string& workload, uint64_t in_bytes,
                         size_t tensors, const Timeline& tl) {
  nlohmann::json j;
  j["workload"] = {{"description", workload}, {"tensors", tensors}, {"fp32_bytes", in_bytes}};
  j["options"] = {{"preset", o.tensors ? std::string("custom") : o.preset},
                  {"size", o.size},
                  {"dtype", o.dtype},
                  {"steps", o.steps},
                  {"every", o.every},
                  {"step_ms", o.step_ms},
                  {"lazy", o.lazy},
                  {"engine", tl.engine}};
  j["calibration"] = {{"passes", tl.passes},
                      {"pass_ms", tl.pass_ms},
                      {"scratch_bytes", tl.scratch_bytes},
                      {"optimizer_ms", tl.optimizer_ms}};
  j["steps"] = nlohmann::json::array();
  for (size_t i = 0; i < tl.steps.size(); ++i) {
    const StepRecord& s = tl.steps[i];
    j["steps"].push_back({{"step", i + 1},
                          {"without_s", s.without_s},
                          {"with_s", s.with_s},
                          {"stall_s", s.stall_s},
                          {"snapshot", s.snapshot},
                          {"in_flight", s.in_flight}});
  }
  j["saves"] = nlohmann::json::array();
  for (const SaveRecord& r : tl.saves) {
    j["saves"].push_back({{"name", r.name},
                          {"step", r.step},
                          {"stall_s", r.stall_s},
                          {"durable_s", r.durable_s},
                          {"bytes", r.bytes}});
  }
  j["summary"] = {{"mean_step_without_s", tl.mean(false)},
                  {"mean_step_with_s", tl.mean(true)},
                  {"overhead_pct", tl.overhead_pct()},
                  {"max_stall_s", tl.max_stall()}};
  std::cout << j.dump(2) << '\n';
}

void print_timeline_csv(const Timeline& tl) {
  std::cout << "step,without_s,with_s,stall_s,snapshot,in_flight\n";
  for (size_t i = 0; i < tl.steps.size(); ++i) {
    const StepRecord& s = tl.steps[i];
    std::cout << i + 1 << ',' << s.without_s << ',' << s.with_s << ',' << s.stall_s << ','
              << (s.snapshot ? 1 : 0) << ',' << (s.in_flight ? 1 : 0) << '\n';
  }
}

// Per-step time of both runs; the snapshot steps are marked.
void plot_timeline(const BenchOptions& o, const Timeline& tl, const fs::path& work) {
  const fs::path data = work / "timeline.dat";
  const fs::path script = work / "timeline.gp";
  {
    std::ofstream d(data);
    for (size_t i = 0; i < tl.steps.size(); ++i) {
      const StepRecord& s = tl.steps[i];
      d << i + 1 << ' ' << s.without_s * 1e3 << ' ' << s.with_s * 1e3 << ' ' << (s.snapshot ? 1 : 0)
        << ' ' << (s.in_flight ? 1 : 0) << '\n';
    }
  }
  const bool cairo = std::system("gnuplot -e 'set terminal pngcairo' >/dev/null 2>&1") == 0;
  {
    std::ofstream g(script);
    g << "set terminal " << (cairo ? "pngcairo" : "png") << " size 960,420\n"
      << "set output '" << o.plot << "'\n"
      << "set title 'training step time, snapshot every " << o.every << " steps ("
      << (o.tensors ? "custom" : o.preset) << ", " << o.dtype << (o.lazy ? ", lazy" : ", eager")
      << "; overhead " << fixed(tl.overhead_pct(), 1) << "%)'\n"
      << "set xlabel 'step'\nset ylabel 'ms'\nset yrange [0:*]\nset key outside right top\n"
      << "set grid ytics\n"
      << "plot '" << data.string() << "' using 1:2 with lines lw 2 title 'without snapshots', "
      << "'' using 1:3 with lines lw 2 title 'with snapshots', "
      << "'' using 1:($5>0?$3:1/0) with points pt 6 ps 1 title 'save writing', "
      << "'' using 1:($4>0?$3:1/0) with points pt 7 ps 1.6 title 'snapshot taken'\n";
  }
  const std::string cmd = "gnuplot '" + script.string() + "'";
  if (std::system(cmd.c_str()) != 0) {
    throw std::runtime_error("gnuplot failed to draw " + o.plot +
                             " (is gnuplot installed? scripts/install-deps.sh)");
  }
}

int run_bench(const BenchOptions& o) {
  const Sweep sweep = parse_sweep(o.sweep);  // validated at parse time
  if (o.budget != "auto" && parse_size(o.budget) < parse_size(o.chunk)) {
    std::cerr << "tsnap: error: --budget (" << o.budget << ") is smaller than --chunk (" << o.chunk
              << ")\n";
    return kExitUsage;
  }
  // The target directory: everything goes to a fresh directory inside it, removed at the end.
  std::error_code ec;
  fs::create_directories(o.dir, ec);
  if (ec || !fs::is_directory(o.dir)) {
    std::cerr << "tsnap: error: cannot use target directory " << o.dir << ": "
              << (ec ? ec.message() : "not a directory") << '\n';
    return kExitFailed;
  }
  const fs::path work = fs::path(o.dir) / ("tsnap-bench-" + std::to_string(::getpid()));
  if (!fs::create_directory(work, ec) || ec) {
    std::cerr << "tsnap: error: cannot write to target directory " << o.dir << ": "
              << (ec ? ec.message() : "already exists: " + work.string()) << '\n';
    return kExitFailed;
  }
  ScopeGuard cleanup([&] {
    detail::remove_tree(work.string());
  });

  Progress progress;
  progress.show("building the state...");
  std::string workload;
  const StateDict state = make_state(o, &workload);
  const uint64_t in_bytes = bench::output_bytes(state, std::nullopt);

  // The largest file at any moment is one state's worth (raw file, snapshot or torch file).
  struct statvfs fsinfo {};
  if (::statvfs(work.c_str(), &fsinfo) == 0) {
    const uint64_t free_bytes = static_cast<uint64_t>(fsinfo.f_bavail) * fsinfo.f_frsize;
    // --timeline: the newest snapshot and the one before it, until the newest commits.
    const uint64_t need = (o.timeline ? 2 : 1) * (in_bytes + in_bytes / 10) + (64ull << 20);
    if (free_bytes < need) {
      progress.done();
      std::cerr << "tsnap: error: not enough free space in " << o.dir << ": the benchmark needs "
                << human_bytes(need) << ", " << human_bytes(free_bytes) << " free\n";
      return kExitFailed;
    }
  }

  if (o.timeline) {
    Timeline tl;
    try {
      tl = run_timeline(o, state, work, progress);
    } catch (...) {
      progress.done();
      throw;
    }
    progress.done();
    if (o.json) {
      print_timeline_json(o, workload, in_bytes, state.size(), tl);
    } else if (o.csv) {
      print_timeline_csv(tl);
    } else {
      print_timeline_table(o, workload, in_bytes, state.size(), tl);
    }
    if (!o.plot.empty()) {
      plot_timeline(o, tl, work);
      std::cerr << "plot written to " << o.plot << '\n';
    }
    return kExitOk;
  }

  std::vector<uint8_t> floor_buf(bench::output_bytes(state, dtype_of(o.dtype)));
  std::memset(floor_buf.data(), 1, floor_buf.size());
  std::vector<PointResult> results;
  const size_t points = sweep.param.empty() ? 1 : sweep.values.size();
  try {
    for (size_t i = 0; i < points; ++i) {
      results.push_back(run_point(o, sweep, i, state, work, floor_buf.data(), progress));
    }
  } catch (...) {
    progress.done();
    throw;
  }
  progress.done();

  if (o.json) {
    print_json(o, sweep, workload, in_bytes, state.size(), results);
  } else if (o.csv) {
    print_csv(sweep, results);
  } else {
    print_table(o, sweep, workload, in_bytes, state.size(), results);
  }
  if (!o.plot.empty()) {
    plot(o, sweep, results, work);
    std::cerr << "plot written to " << o.plot << '\n';
  }
  return kExitOk;
}

}  // namespace

Command add_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* sub = app.add_subcommand("bench", "Measure checkpoint throughput (like fio)");
  sub->footer(
      "Compares, in interleaved repetitions: the raw device (sequential write + fsync and read "
      "of an equal-size file through the same io engine, no staging), tsnap save (stall, "
      "durable time, GB/s) and tsnap::load, torch::save + fsync and torch::load. Loads read a "
      "warm page cache (cold restore: see bench/restore_bench). Files go to a temporary "
      "directory inside --dir, removed on exit.\n"
      "Examples:\n"
      "  tsnap bench --preset gpt2-small --size 0.1 --reps 2\n"
      "  tsnap bench --sweep chunk=4M,16M,64M --plot chunk.png --dir /data\n"
      "  tsnap bench --timeline --steps 60 --every 10 --step-ms 100 --plot timeline.png");
  const auto size_check = CLI::Validator(check_size, "SIZE");
  sub->add_option("--preset", o->preset,
                  "Workload: gpt2-small, llama-1b (13 GB at --size 1), small-tensors or mixed")
      ->check(CLI::IsMember({"gpt2-small", "llama-1b", "small-tensors", "mixed"}))
      ->capture_default_str();
  sub->add_option(
         "--size", o->size,
         "Scale of the preset (gpt2-small, llama-1b: layer widths; small-tensors: count of "
         "10,000), or GiB in all with --tensors")
      ->check(CLI::Range(0.001, 64.0))
      ->capture_default_str();
  sub->add_option("--tensors", o->tensors, "Custom state: N equal fp32 tensors of --size GiB")
      ->check(CLI::Range(1, 1000000));
  sub->add_option("--dtype", o->dtype, "Stored dtype of floating tensors")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  sub->add_option("--threads", o->threads, "Staging threads (0 = half the cores)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  sub->add_option("--chunk", o->chunk, "Chunk size (multiple of 4096; K/M/G suffixes)")
      ->check(CLI::Validator(check_chunk, "SIZE"))
      ->capture_default_str();
  sub->add_option("--depth", o->depth, "io_uring queue depth (and raw writes in flight)")
      ->check(CLI::Range(1u, 4096u))
      ->capture_default_str();
  sub->add_option("--engine", o->engine, "Write engine: auto, uring or pwrite")
      ->check(CLI::IsMember({"auto", "uring", "pwrite"}))
      ->capture_default_str();
  sub->add_option("--direct", o->direct, "O_DIRECT where the filesystem allows it: on or off")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  sub->add_option("--budget", o->budget,
                  "Staging budget (K/M/G suffixes); auto holds the whole snapshot")
      ->check(size_check | CLI::IsMember({"auto"}))
      ->capture_default_str();
  sub->add_flag("--lazy", o->lazy, "Lazy staging (save_async returns before staging)");
  sub->add_option("--reps", o->reps, "Repetitions")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  sub->add_option("--dir", o->dir, "Target directory (on the device to measure)")
      ->capture_default_str();
  sub->add_flag("--no-torch", o->no_torch, "Skip torch::save / torch::load");
  sub->add_flag("--no-restore", o->no_restore, "Skip tsnap::load");
  auto* json = sub->add_flag("--json", o->json, "Print the results as JSON");
  sub->add_flag("--csv", o->csv, "Print the results as CSV")->excludes(json);
  auto* sweep_opt =
      sub->add_option("--sweep", o->sweep,
                      "Run the set once per value: threads=1,2 | chunk=4M,16M,64M | depth=8,32 | "
                      "budget=256M,1G")
          ->check(CLI::Validator(
              [](std::string& s) -> std::string {
                try {
                  parse_sweep(s);
                  return "";
                } catch (const std::exception& e) {
                  return s + ": " + e.what();
                }
              },
              "PARAM=V1,V2"));
  sub->add_option("--plot", o->plot,
                  "Draw GB/s against the swept parameter (with --timeline: the per-step "
                  "time) into a PNG (gnuplot)")
      ->type_name("PNG");
  auto* timeline = sub->add_flag("--timeline", o->timeline,
                                 "Simulate a training loop: per-step time without and with a "
                                 "snapshot every --every steps")
                       ->excludes(sweep_opt);
  sub->add_option("--steps", o->steps, "--timeline: steps per run")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str()
      ->needs(timeline);
  sub->add_option("--every", o->every, "--timeline: snapshot every N steps")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str()
      ->needs(timeline);
  sub->add_option("--step-ms", o->step_ms, "--timeline: target step time in ms (calibrated)")
      ->check(CLI::Range(1.0, 600000.0))
      ->capture_default_str()
      ->needs(timeline);
  return {sub, [o] { return run_bench(*o); }};
}

}  // namespace tsnap::cli
