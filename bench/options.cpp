#include "bench/options.h"

#include <c10/util/Exception.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <exception>
#include <iostream>
#include <sstream>
#include <stdexcept>

namespace tsnap::bench {
namespace {

std::string check_size(const std::string& text) {
  try {
    parse_size(text);
    return "";
  } catch (const std::exception&) {
    return "bad size '" + text + "' (e.g. 4096, 64K, 16M, 1G)";
  }
}

std::string check_chunk(const std::string& text) {
  const std::string why = check_size(text);
  if (!why.empty()) return why;
  if (parse_size(text) % 4096 != 0) return "chunk size must be a multiple of 4096: " + text;
  return "";
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, sep)) out.push_back(item);
  return out;
}

}  // namespace

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

void add_workload_options(CLI::App& app, BenchOptions& o) {
  app.add_option("--preset", o.preset,
                 "Workload: gpt2-small, llama-1b (13 GB at --size 1), small-tensors or mixed")
      ->check(CLI::IsMember({"gpt2-small", "llama-1b", "small-tensors", "mixed"}))
      ->capture_default_str();
  app.add_option("--size", o.size,
                 "Scale of the preset (gpt2-small, llama-1b: layer widths; small-tensors: count "
                 "of 10,000), or GiB in all with --tensors")
      ->check(CLI::Range(0.001, 64.0))
      ->capture_default_str();
  app.add_option("--tensors", o.tensors, "Custom state: N equal fp32 tensors of --size GiB")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--dtype", o.dtype, "Stored dtype of floating tensors")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
}

void add_scale_option(CLI::App& app, BenchOptions& o) {
  app.add_option("--scale", o.size, "Scale of the GPT-2 small layer widths")
      ->check(CLI::Range(0.001, 64.0))
      ->capture_default_str();
}

void add_chunk_option(CLI::App& app, BenchOptions& o) {
  app.add_option("--chunk", o.chunk, "Chunk size (multiple of 4096; K/M/G suffixes)")
      ->check(CLI::Validator(check_chunk, "SIZE"))
      ->capture_default_str();
}

void add_budget_option(CLI::App& app, BenchOptions& o, const std::string& help, bool allow_auto) {
  const auto size_check = CLI::Validator(check_size, "SIZE");
  app.add_option("--budget", o.budget, help)
      ->check(allow_auto ? size_check | CLI::IsMember({"auto"}) : size_check)
      ->capture_default_str();
}

void add_pipeline_options(CLI::App& app, BenchOptions& o) {
  app.add_option("--threads", o.threads, "Staging threads (0 = every core eager, half lazy)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  add_chunk_option(app, o);
  app.add_option("--depth", o.depth, "io_uring queue depth (and raw writes in flight)")
      ->check(CLI::Range(1u, 4096u))
      ->capture_default_str();
  app.add_option("--engine", o.engine, "Write engine: auto, uring or pwrite")
      ->check(CLI::IsMember({"auto", "uring", "pwrite"}))
      ->capture_default_str();
  app.add_option("--direct", o.direct, "O_DIRECT where the filesystem allows it: on or off")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  add_budget_option(app, o, "Staging budget (K/M/G suffixes); auto holds the whole snapshot", true);
  app.add_flag("--lazy", o.lazy, "Lazy staging (save_async returns before staging)");
  app.add_option("--priority", o.priority,
                 "Priority of the pipeline's background threads: background (lower CPU and I/O "
                 "priority, the default) or normal")
      ->check(CLI::IsMember({"background", "normal"}))
      ->capture_default_str();
}

void add_run_options(CLI::App& app, BenchOptions& o, const std::string& dir_help) {
  app.add_option("--reps", o.reps, "Repetitions")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--dir", o.dir, dir_help)->capture_default_str();
  app.add_flag("--no-torch", o.no_torch, "Skip torch::save / torch::load");
}

void add_report_options(CLI::App& app, BenchOptions& o) {
  app.add_flag("--no-restore", o.no_restore, "Skip tsnap::load");
  auto* json = app.add_flag("--json", o.json, "Print the results as JSON");
  app.add_flag("--csv", o.csv, "Print the results as CSV")->excludes(json);
  app.add_option("--sweep", o.sweep,
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
  app.add_option("--plot", o.plot,
                 "Draw GB/s against the swept parameter (with --timeline: the per-step "
                 "time) into a PNG (gnuplot)")
      ->type_name("PNG");
}

void add_timeline_options(CLI::App& app, BenchOptions& o) {
  auto* timeline = app.add_flag("--timeline", o.timeline,
                                "Simulate a training loop: per-step time without and with a "
                                "snapshot every --every steps")
                       ->excludes(app.get_option("--sweep"));
  app.add_option("--steps", o.steps, "--timeline: steps per run")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str()
      ->needs(timeline);
  app.add_option("--every", o.every, "--timeline: snapshot every N steps")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str()
      ->needs(timeline);
  app.add_option("--step-ms", o.step_ms, "--timeline: target step time in ms (calibrated)")
      ->check(CLI::Range(1.0, 600000.0))
      ->capture_default_str()
      ->needs(timeline);
}

std::string check_options(const BenchOptions& o) {
  if (o.budget != "auto" && parse_size(o.budget) < parse_size(o.chunk)) {
    return "--budget (" + o.budget + ") is smaller than --chunk (" + o.chunk + ")";
  }
  return "";
}

SnapshotterOptions snapshotter_options(const BenchOptions& o, uint64_t output_bytes,
                                       const std::filesystem::path& root) {
  SnapshotterOptions so;
  so.root = root;
  so.chunk_bytes = parse_size(o.chunk);
  so.staging.budget_bytes = o.budget == "auto"
                                ? (output_bytes / so.chunk_bytes + 2) * so.chunk_bytes
                                : parse_size(o.budget);
  so.staging.threads = o.threads;
  so.io.queue_depth = o.depth;
  so.io.engine = o.engine == "uring"    ? EngineKind::kUring
                 : o.engine == "pwrite" ? EngineKind::kPwrite
                                        : EngineKind::kAuto;
  so.io.direct_io = o.direct == "on";
  so.max_in_flight = 1;
  so.background_priority = o.priority == "background";
  return so;
}

void apply_sweep_value(const std::string& param, const std::string& value, SnapshotterOptions* so) {
  if (param == "threads") so->staging.threads = std::stoi(value);
  if (param == "depth") so->io.queue_depth = static_cast<unsigned>(std::stoul(value));
  if (param == "chunk") so->chunk_bytes = parse_size(value);
  if (param == "budget") so->staging.budget_bytes = parse_size(value);
}

int run_program(int argc, char** argv, const std::string& name, const std::string& description,
                BenchOptions& o, const std::function<void(CLI::App&)>& add_options,
                const std::function<int()>& run) {
  o.dir = std::filesystem::temp_directory_path().string();
  CLI::App app(description, name);
  add_scale_option(app, o);
  add_options(app);
  add_run_options(app, o, "Target directory: files go to a fresh directory inside it");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help exits 0; usage errors 2
  }
  auto fail = [&](const std::string& message, int status) {
    std::cerr << name << ": error: " << message << '\n';
    return status;
  };
  try {
    const std::string why = check_options(o);
    if (!why.empty()) return fail(why, 2);
    return run();
  } catch (const c10::Error& e) {
    return fail(e.what_without_backtrace(), 1);
  } catch (const std::exception& e) {
    return fail(e.what(), 1);
  }
}

}  // namespace tsnap::bench
