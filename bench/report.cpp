#include "bench/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "bench/measure.h"
#include "common/text_table.h"

namespace fs = std::filesystem;

namespace tsnap::bench {
namespace {

using detail::human_bytes;
using detail::Table;

std::string fixed(double v, int digits) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(digits) << v;
  return o.str();
}

void print_workload(const BenchOptions& o, const StateInfo& state) {
  std::cout << "workload: " << state.description << ", " << state.tensors << " tensors, "
            << human_bytes(state.fp32_bytes) << " fp32, stored as " << o.dtype << "\n";
}

nlohmann::json workload_json(const StateInfo& state) {
  return {{"description", state.description},
          {"tensors", state.tensors},
          {"fp32_bytes", state.fp32_bytes}};
}

// The options that both JSON outputs list (objects print their keys sorted).
nlohmann::json options_json(const BenchOptions& o) {
  return {{"preset", o.tensors ? std::string("custom") : o.preset},
          {"size", o.size},
          {"dtype", o.dtype},
          {"lazy", o.lazy}};
}

// Writes `script` to `path` after the lines that make gnuplot draw a PNG of `size` into `png`
// (pngcairo where gnuplot has it), then runs gnuplot on it.
void gnuplot(const fs::path& path, const std::string& size, const std::string& png,
             const std::string& script) {
  const bool cairo = std::system("gnuplot -e 'set terminal pngcairo' >/dev/null 2>&1") == 0;
  {
    std::ofstream g(path);
    g << "set terminal " << (cairo ? "pngcairo" : "png") << " size " << size << "\n"
      << "set output '" << png << "'\n"
      << script;
  }
  const std::string cmd = "gnuplot '" + path.string() + "'";
  if (std::system(cmd.c_str()) != 0) {
    throw std::runtime_error("gnuplot failed to draw " + png +
                             " (is gnuplot installed? scripts/install-deps.sh)");
  }
}

// A ratio of two measures, per repetition where both have one per repetition (each pair was
// measured minutes apart at most, so a device or host that changed pace between repetitions
// moves both), else of their medians: its median and range.
struct RatioValue {
  double median = 0, min = 0, max = 0;
};

RatioValue ratio(const PointResult& r, const std::string& num, const std::string& den, bool gbps) {
  const Measure* a = r.find(num);
  const Measure* b = r.find(den);
  if (!a || !b) return {};
  const auto one = [&](double na, double nb) {
    if (na <= 0 || nb <= 0) return 0.0;
    if (!gbps) return na / nb;
    return b->bytes > 0 ? (a->bytes / na) / (b->bytes / nb) : 0.0;
  };
  Series q;
  if (a->s.v.size() == b->s.v.size() && a->s.v.size() > 1) {
    for (size_t i = 0; i < a->s.v.size(); ++i) q.add(one(a->s.v[i], b->s.v[i]));
  } else {
    q.add(one(a->s.median(), b->s.median()));
  }
  return {q.median(), q.min(), q.max()};
}

struct Ratio {
  std::string key, label, num, den;
  bool gbps;
};

const std::vector<Ratio>& ratios() {
  static const std::vector<Ratio> list = {
      {"save_vs_raw", "tsnap save GB/s / raw write GB/s", "tsnap_save", "raw_write", true},
      {"stall_vs_memcpy", "tsnap stall / memcpy time", "tsnap_stall", "memcpy", false},
      {"stall_vs_convert", "tsnap stall / convert time", "tsnap_stall", "convert", false},
      {"staged_vs_memcpy", "lazy: call to staged / memcpy time", "tsnap_staged", "memcpy", false},
      {"torch_save_vs_save", "torch::save time / tsnap save time", "torch_save", "tsnap_save",
       false},
      {"torch_save_vs_stall", "torch::save time / tsnap stall", "torch_save", "tsnap_stall", false},
      {"load_vs_raw_read", "cold tsnap::load GB/s / raw read GB/s", "tsnap_load", "raw_read", true},
      {"verify_vs_raw_read", "cold tsnap::verify GB/s / raw read GB/s", "tsnap_verify", "raw_read",
       true},
      {"torch_load_vs_load", "cold torch::load / tsnap::load time", "torch_load", "tsnap_load",
       false},
      {"torch_load_vs_load_warm", "warm torch::load / tsnap::load time", "torch_load_warm",
       "tsnap_load_warm", false},
      {"construct_vs_memset", "Snapshotter make / former memset", "construct", "first_touch",
       false},
      {"first_vs_stall", "first save's stall / later saves' stall", "first_stall", "tsnap_stall",
       false},
  };
  return list;
}

void print_table(const BenchOptions& o, const Sweep& sweep, const StateInfo& state,
                 const std::vector<PointResult>& results) {
  print_workload(o, state);
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
    std::cout << "ratios (median of the repetitions' own ratios, min..max):\n";
    for (const Ratio& q : ratios()) {
      const RatioValue v = ratio(r, q.num, q.den, q.gbps);
      if (v.median <= 0) continue;
      std::cout << "  " << std::left << std::setw(40) << q.label << fixed(v.median, 2);
      if (v.max > v.min) std::cout << "  " << fixed(v.min, 2) << ".." << fixed(v.max, 2);
      std::cout << '\n';
    }
    std::cout << "  process CPU time per save (median)      " << fixed(r.cpu_s.median(), 3)
              << " s\n";
  }
  std::cout << "\npeak RSS " << human_bytes(static_cast<uint64_t>(peak_rss_kib()) * 1024)
            << "; cold loads read files evicted from the page cache (posix_fadvise), warm "
               "ones files read once; load_into and a raw-read sweep: tsnap_bench_restore\n";
}

nlohmann::json series_json(const Measure& m) {
  return {{"median_s", m.s.median()},
          {"min_s", m.s.min()},
          {"max_s", m.s.max()},
          {"reps_s", m.s.v},
          {"bytes", static_cast<uint64_t>(m.bytes)},
          {"gbps", m.gbps()}};
}

void print_json(const BenchOptions& o, const Sweep& sweep, const StateInfo& state,
                const std::vector<PointResult>& results) {
  nlohmann::json j;
  j["workload"] = workload_json(state);
  j["options"] = options_json(o);
  j["options"].update({{"threads", o.threads},
                       {"chunk", o.chunk},
                       {"depth", o.depth},
                       {"engine", o.engine},
                       {"direct", o.direct},
                       {"budget", o.budget},
                       {"reps", o.reps}});
  j["sweep"] = sweep.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(sweep.param);
  j["results"] = nlohmann::json::array();
  for (const PointResult& r : results) {
    nlohmann::json p = {{"value", r.value}, {"engine", r.engine}};
    for (const Measure& m : r.m) {
      if (!m.s.empty()) p["measures"][m.key] = series_json(m);
    }
    for (const Ratio& q : ratios()) {
      const RatioValue v = ratio(r, q.num, q.den, q.gbps);
      if (v.median > 0) {
        p["ratios"][q.key] = v.median;
        p["ratio_ranges"][q.key] = {v.min, v.max};
      }
    }
    p["cpu_s_per_save"] = r.cpu_s.median();
    j["results"].push_back(p);
  }
  j["peak_rss_bytes"] = static_cast<uint64_t>(peak_rss_kib()) * 1024;
  j["restore_cache"] = "tsnap_load, torch_load: cold (evicted); *_warm: warm (cached)";
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

std::string ms(double s) { return fixed(s * 1e3, 1); }

void print_timeline_table(const BenchOptions& o, const StateInfo& state, const Timeline& tl) {
  print_workload(o, state);
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
            << "%; median over blocks of " << tl.every << " steps "
            << fixed(tl.block_overhead_median_pct(), 2) << "%); max stall "
            << fixed(tl.max_stall() * 1e3, 2) << " ms\n";
}

void print_timeline_json(const BenchOptions& o, const StateInfo& state, const Timeline& tl) {
  nlohmann::json j;
  j["workload"] = workload_json(state);
  j["options"] = options_json(o);
  j["options"].update(
      {{"steps", o.steps}, {"every", o.every}, {"step_ms", o.step_ms}, {"engine", tl.engine}});
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
                  {"block_overhead_median_pct", tl.block_overhead_median_pct()},
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

// One line of the bench programs' reports: "  NAME  MEDIAN s  (MIN..MAX)  GB/s", the name
// padded to `width`.
void print_row(int width, const std::string& name, const Series& s, double bytes) {
  std::printf("  %-*s %8.3f s  (%.3f..%.3f)  %6.2f GB/s\n", width, name.c_str(), s.median(),
              s.min(), s.max(), bytes / s.median() / 1e9);
}

}  // namespace

void print_points(const BenchOptions& o, const StateInfo& state,
                  const std::vector<PointResult>& results) {
  const Sweep sweep = parse_sweep(o.sweep);
  if (o.json) {
    print_json(o, sweep, state, results);
  } else if (o.csv) {
    print_csv(sweep, results);
  } else {
    print_table(o, sweep, state, results);
  }
}

void print_timeline(const BenchOptions& o, const StateInfo& state, const Timeline& tl) {
  if (o.json) {
    print_timeline_json(o, state, tl);
  } else if (o.csv) {
    print_timeline_csv(tl);
  } else {
    print_timeline_table(o, state, tl);
  }
}

void plot_points(const BenchOptions& o, const std::vector<PointResult>& results,
                 const fs::path& work) {
  const Sweep sweep = parse_sweep(o.sweep);
  const fs::path data = work / "plot.dat";
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
  std::ostringstream g;
  g << "set title 'tsnap save throughput (" << (o.tensors ? "custom" : o.preset) << ", " << o.dtype
    << ")'\n"
    << "set xlabel '" << (sweep.param.empty() ? "run" : sweep.param) << "'\n"
    << "set ylabel 'GB/s'\nset yrange [0:*]\nset key outside right top\n"
    << "set grid ytics\nset offsets 0.3,0.3,graph 0.12,0\n"
    << "plot '" << data.string() << "' using 1:3:xtic(2) with linespoints lw 2 pt 7 title "
    << "'tsnap save (durable)', "
    << (has_torch ? "'' using 1:5 with linespoints pt 5 title 'torch::save + fsync', " : "")
    << raw.median() << " with lines dt 2 lw 2 title 'raw write (median " << fixed(raw.median(), 2)
    << " GB/s)'\n";
  gnuplot(work / "plot.gp", "860,420", o.plot, g.str());
}

void plot_timeline(const BenchOptions& o, const Timeline& tl, const fs::path& work) {
  const fs::path data = work / "timeline.dat";
  {
    std::ofstream d(data);
    for (size_t i = 0; i < tl.steps.size(); ++i) {
      const StepRecord& s = tl.steps[i];
      d << i + 1 << ' ' << s.without_s * 1e3 << ' ' << s.with_s * 1e3 << ' ' << (s.snapshot ? 1 : 0)
        << ' ' << (s.in_flight ? 1 : 0) << '\n';
    }
  }
  std::ostringstream g;
  g << "set title 'training step time, snapshot every " << o.every << " steps ("
    << (o.tensors ? "custom" : o.preset) << ", " << o.dtype << (o.lazy ? ", lazy" : ", eager")
    << "; overhead " << fixed(tl.overhead_pct(), 1) << "%)'\n"
    << "set xlabel 'step'\nset ylabel 'ms'\nset yrange [0:*]\nset key outside right top\n"
    << "set grid ytics\n"
    << "plot '" << data.string() << "' using 1:2 with lines lw 2 title 'without snapshots', "
    << "'' using 1:3 with lines lw 2 title 'with snapshots', "
    << "'' using 1:($5>0?$3:1/0) with points pt 6 ps 1 title 'save writing', "
    << "'' using 1:($4>0?$3:1/0) with points pt 7 ps 1.6 title 'snapshot taken'\n";
  gnuplot(work / "timeline.gp", "960,420", o.plot, g.str());
}

void print_save_report(const SaveBenchResult& result) {
  const PointSpec& spec = result.spec;
  const PointResult& r = result.point;
  const double budget_mib = spec.snapshotter.staging.budget_bytes / 1048576.0;
  auto row = [&](const char* name, const char* key) {
    print_row(34, name, r.get(key).s, r.get(key).bytes);
  };
  std::printf("engine: %s, staging budget %.0f MiB, chunk %.0f MiB\n", r.engine.c_str(), budget_mib,
              spec.snapshotter.chunk_bytes / 1048576.0);
  std::printf("\nGPT-2-small + Adam, %d reps (median, min..max):\n", spec.reps);
  row("raw O_DIRECT write + fsync", "raw_write");
  row("tsnap save fp32 (durable)", "tsnap_save");
  row("tsnap save bf16 (durable)", "tsnap_save_bf16");
  row("tsnap stall fp32", "tsnap_stall");
  row("tsnap stall bf16", "tsnap_stall_bf16");
  row("  of which staging copy fp32", "tsnap_stage");
  row("memcpy 2 threads fp32 bytes", "memcpy");
  row("memcpy 2 threads bf16 bytes", "memcpy_bf16");
  row("fp32->bf16 convert 2 threads", "convert_bf16");
  if (spec.torch_save) row("torch::save + fsync", "torch_save");
  auto median = [&](const char* key) { return r.get(key).s.median(); };
  std::printf("\nratios (targets in brackets):\n");
  std::printf("  durable fp32 throughput / raw    %.2f  [>= 0.9]\n",
              r.get("tsnap_save").gbps() / r.get("raw_write").gbps());
  std::printf("  durable bf16 throughput / raw    %.2f  [>= 0.9]\n",
              r.get("tsnap_save_bf16").gbps() / r.get("raw_write").gbps());
  std::printf("  stall fp32 / memcpy              %.2f  [<= 1.2]\n",
              median("tsnap_stall") / median("memcpy"));
  std::printf("  stall bf16 / memcpy              %.2f  [<= 1.2]\n",
              median("tsnap_stall_bf16") / median("memcpy_bf16"));
  std::printf("  stall bf16 / convert             %.2f  [<= 1.1]\n",
              median("tsnap_stall_bf16") / median("convert_bf16"));
  if (spec.torch_save) {
    std::printf("  torch::save / stall fp32         %.1f  [>= 10]\n",
                median("torch_save") / median("tsnap_stall"));
    std::printf("  torch::save / stall bf16         %.1f  [>= 10]\n",
                median("torch_save") / median("tsnap_stall_bf16"));
  }

  if (result.small) {
    const SmallVsLarge& s = *result.small;
    std::printf("\n10,000 small tensors (4-64 KiB, %.0f MB) vs 8 large of the same total:\n",
                s.bytes / 1e6);
    print_row(34, "small tensors (durable)", s.small, s.bytes);
    print_row(34, "large tensors (durable)", s.large, s.bytes);
    print_row(34, "  small: stall", s.small_stall, s.bytes);
    print_row(34, "  large: stall", s.large_stall, s.bytes);
    print_row(34, "  small: commit (fsync, manifest)", s.small_commit, s.bytes);
    print_row(34, "  large: commit (fsync, manifest)", s.large_commit, s.bytes);
    std::printf(
        "  small / large throughput         %.2f  (%.2f..%.2f, paired by repetition)  "
        "[>= 0.95]\n",
        s.ratio.median(), s.ratio.min(), s.ratio.max());
  }
  if (result.soak) {
    const Soak& s = *result.soak;
    std::printf("\nRSS over %d saves: first %.0f MiB, last %.0f MiB, range %.0f..%.0f MiB\n",
                s.saves, s.first_kib / 1024.0, s.last_kib / 1024.0, s.min_kib / 1024.0,
                s.max_kib / 1024.0);
  }
  std::printf(
      "\nmemory: RSS before %.0f MiB, after pool %.0f MiB, peak %.0f MiB; "
      "staging budget %.0f MiB\n",
      result.rss_before_kib / 1024.0, r.rss_after_pool_kib / 1024.0, peak_rss_kib() / 1024.0,
      budget_mib);
}

void print_dist_report(const BenchOptions& o, const std::vector<DistPoint>& points) {
  if (points.empty()) return;
  const DistPoint& base = points.front();
  std::printf("state on every rank: GPT-2-small + Adam (scale %.2f), %zu tensors, %s (one copy)\n",
              o.size, base.tensors, human_bytes(base.state_bytes).c_str());
  std::printf("engine %s, chunk %s, staging budget per rank %s, %d saves per point%s\n",
              base.engine.c_str(), o.chunk.c_str(),
              o.budget == "auto" ? "auto (the rank's share)" : o.budget.c_str(), o.reps,
              o.lazy ? ", lazy staging" : "");

  std::printf("\nwhole snapshot, first save_async to last commit (median, min..max):\n");
  Table t({"RANKS", "WALL s", "MIN..MAX", "GB/s", "RAW GB/s", "/ RAW"});
  for (size_t c : {1, 3, 4, 5}) t.set_numeric(c);
  for (const DistPoint& p : points) {
    uint64_t bytes = 0;  // the snapshot: every rank's files and the manifest
    for (const auto& rank : p.saves) bytes += rank.front().stats.bytes;
    const double gbps = bytes / p.wall.median() / 1e9;
    const double raw = p.state_bytes / p.raw_write.median() / 1e9;
    t.add_row({p.label(), fixed(p.wall.median(), 3),
               fixed(p.wall.min(), 3) + ".." + fixed(p.wall.max(), 3), fixed(gbps, 2),
               fixed(raw, 2), fixed(gbps / raw, 2)});
  }
  t.print(std::cout);

  std::printf("\nper rank (median):\n");
  Table r({"RANKS", "RANK", "FILES", "BYTES", "STALL s", "WRITE s", "COMMIT s", "COORDINATE s",
           "TOTAL s"});
  for (size_t c = 1; c < 9; ++c) r.set_numeric(c);
  for (const DistPoint& p : points) {
    for (size_t k = 0; k < p.saves.size(); ++k) {
      r.add_row({p.label(), std::to_string(k), std::to_string(p.saves[k].front().stats.files),
                 human_bytes(p.rank_file_bytes.at(k)),
                 fixed(p.series(k, &SaveStats::stall_s).median(), 3),
                 fixed(p.series(k, &SaveStats::write_s).median(), 3),
                 fixed(p.series(k, &SaveStats::commit_s).median(), 3),
                 p.group ? fixed(p.series(k, &SaveStats::coordinate_s).median(), 3) : "-",
                 fixed(p.series(k, &SaveStats::total_s).median(), 3)});
    }
  }
  r.print(std::cout);

  std::printf("\nchecks and ratios:\n");
  for (const DistPoint& p : points) {
    uint64_t sum = 0;
    for (uint64_t b : p.rank_file_bytes) sum += b;
    const double commit = p.series(0, &SaveStats::commit_s).median();
    std::printf("  %-12s ranks' files %s = snapshot %s; tensor bytes over ranks = one copy: %s",
                p.label().c_str(), human_bytes(sum).c_str(), human_bytes(p.snapshot_bytes).c_str(),
                p.one_copy() ? "yes" : "NO");
    if (p.group) {
      std::printf("; rank 0 commit %+.3f s vs no group",
                  commit - base.series(0, &SaveStats::commit_s).median());
    }
    std::printf("\n");
  }
}

void print_restore_report(const RestoreSpec& spec, const RestoreResult& r) {
  const double bytes = r.bytes;
  auto row = [&](const std::string& name, const Series& s) { print_row(36, name, s, bytes); };
  std::printf(
      "snapshot: %.3f GB in %zu shards; engine %s; read budget %.0f MiB, chunk %.0f "
      "MiB\n",
      bytes / 1e9, r.shards, r.engine.c_str(), spec.read_budget / 1048576.0,
      spec.chunk / 1048576.0);
  std::printf("\nGPT-2-small + Adam restore, %d reps (median, min..max):\n", spec.reps);
  std::printf(" cold (files evicted from the page cache before each run):\n");
  for (const RestoreResult::RawRead& raw : r.raw_direct) {
    row("raw O_DIRECT read " + std::to_string(raw.block >> 20) + "M x " + std::to_string(raw.depth),
        raw.s);
  }
  row("raw buffered read", r.raw_buffered);
  row("tsnap load_into [" + r.cold_engine + "]", r.cold_into);
  row("tsnap load (new tensors)", r.cold_load);
  if (spec.torch) row("torch::load", r.cold_torch);
  std::printf(" warm (files in the page cache):\n");
  row("raw buffered read", r.warm_raw);
  row("tsnap load_into [" + r.warm_engine + "]", r.warm_into);
  row("tsnap load_into, verify off", r.warm_into_noverify);
  row("tsnap load (new tensors)", r.warm_load);
  if (spec.torch) row("torch::load", r.warm_torch);
  if (spec.hot) {
    std::printf(" hot (the Snapshotter's staging buffers, keep_hot: no file read):\n");
    row("tsnap load_into [memory]", r.hot_into);
    row("tsnap load (new tensors)", r.hot_load);
  }

  const RestoreResult::RawRead& best = r.best_raw();
  const double raw_best = best.s.median();
  std::printf("\nratios (targets in brackets; raw = the best of the sweep, %lluM x %u):\n",
              static_cast<unsigned long long>(best.block >> 20), best.depth);
  std::printf("  cold load_into throughput / raw   %.2f  [>= 0.9]\n",
              raw_best / r.cold_into.median());
  std::printf("  cold load throughput / raw        %.2f  [>= 0.9]\n",
              raw_best / r.cold_load.median());
  if (spec.torch) {
    std::printf("  cold torch::load / load_into      %.2f  [> 1]\n",
                r.cold_torch.median() / r.cold_into.median());
    std::printf("  cold torch::load / load           %.2f  [> 1]\n",
                r.cold_torch.median() / r.cold_load.median());
    std::printf("  warm torch::load / load_into      %.2f  [>= 2]\n",
                r.warm_torch.median() / r.warm_into.median());
    std::printf("  warm torch::load / load_into, no verify %.2f\n",
                r.warm_torch.median() / r.warm_into_noverify.median());
    std::printf("  warm torch::load / load           %.2f\n",
                r.warm_torch.median() / r.warm_load.median());
  }
  if (spec.hot) {
    std::printf("  cold load_into / hot load_into    %.2f  [>= 5]\n",
                r.cold_into.median() / r.hot_into.median());
    std::printf("  warm load_into / hot load_into    %.2f\n",
                r.warm_into.median() / r.hot_into.median());
    std::printf("  cold load / hot load              %.2f\n",
                r.cold_load.median() / r.hot_load.median());
  }
  std::printf("  peak extra RSS of load_into       %.0f MiB  [<= %.0f MiB = budget + 64]\n",
              r.peak_extra_kib / 1024.0, spec.read_budget / 1048576.0 + 64);
}

}  // namespace tsnap::bench
