#pragma once
// The options of the benchmarks, one struct for `tsnap bench`, `tsnap_bench_save`,
// `tsnap_bench_restore` and `tsnap_bench_dist`, and their CLI11 definitions: each program
// registers the groups it uses, so that an option means the same everywhere and is parsed in one
// place.

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tsnap/snapshotter.h"

namespace CLI {
class App;
}

namespace tsnap::bench {

/// Every option of the benchmarks; each program reads the fields of the groups it registers.
/// The defaults are those of `tsnap bench`; a program changes them before it registers them.
struct BenchOptions {
  // Workload (add_workload_options; the bench programs register only --scale).
  std::string preset = "gpt2-small";
  double size = 1.0;
  int tensors = 0;
  std::string dtype = "f32";
  // Pipeline (add_pipeline_options).
  int threads = 0;
  std::string chunk = "16M";
  unsigned depth = 32;
  std::string engine = "auto";
  std::string direct = "on";
  std::string budget = "auto";  // the whole snapshot, so that the stall is the staging copy
  bool lazy = false;
  std::string priority = "background";  // SnapshotterOptions::background_priority
  // Run (add_run_options).
  int reps = 3;
  std::string dir = ".";
  bool no_torch = false;
  // `tsnap bench` only (add_report_options, add_timeline_options).
  bool no_restore = false;
  bool json = false;
  bool csv = false;
  std::string sweep;
  std::string plot;
  bool timeline = false;
  int steps = 60;
  int every = 10;
  double step_ms = 100;
  // tsnap_bench_save only.
  int soak = 0;
  bool no_small = false;
  // tsnap_bench_restore only.
  bool keep = false;
  // tsnap_bench_dist only (besides the baseline without a group).
  std::vector<int> ranks = {1, 2, 4};
};

/// The values of a swept parameter (`--sweep PARAM=V1,V2`).
struct Sweep {
  std::string param;  ///< "" when nothing is swept
  std::vector<std::string> values;
};

/// "4096", "64K", "16M", "1G" (binary multiples) in bytes. Throws std::invalid_argument.
uint64_t parse_size(const std::string& text);

/// Parses "threads=1,2" | "chunk=4M,16M" | "depth=8,32" | "budget=256M,1G" ("" sweeps nothing).
/// Throws std::invalid_argument naming the bad part.
Sweep parse_sweep(const std::string& text);

/// The stored dtype named by --dtype: bf16, f16, or unset for f32 (the states are fp32).
std::optional<at::ScalarType> dtype_of(const std::string& name);

/// Registers --preset, --size, --tensors and --dtype into `o`. `o` must outlive `app`'s parse.
void add_workload_options(CLI::App& app, BenchOptions& o);

/// Registers --scale (the bench programs' GPT-2 small scale) into `o.size`.
void add_scale_option(CLI::App& app, BenchOptions& o);

/// Registers --threads, --chunk, --depth, --engine, --direct, --budget, --lazy and --priority
/// into `o`.
void add_pipeline_options(CLI::App& app, BenchOptions& o);

/// Registers --chunk (a size, multiple of 4096) into `o.chunk`.
void add_chunk_option(CLI::App& app, BenchOptions& o);

/// Registers --budget (a size, or `auto` when `allow_auto`) into `o.budget`, with `help`.
void add_budget_option(CLI::App& app, BenchOptions& o, const std::string& help, bool allow_auto);

/// Registers --reps, --dir (`dir_help` says what it is for) and --no-torch into `o`.
void add_run_options(CLI::App& app, BenchOptions& o, const std::string& dir_help);

/// Registers --no-restore, --json, --csv, --sweep and --plot into `o` (`tsnap bench`).
void add_report_options(CLI::App& app, BenchOptions& o);

/// Registers --timeline, --steps, --every and --step-ms into `o` (`tsnap bench`); --timeline
/// excludes --sweep, so add_report_options comes first.
void add_timeline_options(CLI::App& app, BenchOptions& o);

/// What is wrong with a parsed `o` that no single option can tell (a budget smaller than a
/// chunk), or "" when nothing is.
std::string check_options(const BenchOptions& o);

/// The snapshotter that `o` describes, writing under `root`. A budget of `auto` holds
/// `output_bytes` (the state as stored) plus two chunks.
SnapshotterOptions snapshotter_options(const BenchOptions& o, uint64_t output_bytes,
                                       const std::filesystem::path& root);

/// Sets `param` (a Sweep parameter) of `so` to `value`.
void apply_sweep_value(const std::string& param, const std::string& value, SnapshotterOptions* so);

/// The main of a bench program called `name`: registers --scale, the options `add_options`
/// adds, then --reps, --dir (default: the system's temporary directory) and --no-torch into `o`;
/// parses the command line (--help exits 0, a usage error 2, both with CLI11's message);
/// checks it with check_options(o) (exit 2); then returns `run()`. An exception becomes
/// "NAME: error: MESSAGE" on stderr and exit status 1.
int run_program(int argc, char** argv, const std::string& name, const std::string& description,
                BenchOptions& o, const std::function<void(CLI::App&)>& add_options,
                const std::function<int()>& run);

}  // namespace tsnap::bench
