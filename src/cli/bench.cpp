// `tsnap bench`: checkpoint throughput, like fio for snapshots. A front-end over the bench
// library (bench/): it registers the library's options, builds the workload state, and runs
// either the save runner (bench/runner.h) once per value of an optional swept parameter, or,
// with --timeline, a simulated training loop (bench/timeline.h); then prints a table with ratios
// (or JSON / CSV) and optionally a gnuplot PNG (bench/report.h). Everything it writes lives in
// one directory under --dir that is removed on every way out.

#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "bench/options.h"
#include "bench/report.h"
#include "bench/runner.h"
#include "bench/session.h"
#include "bench/timeline.h"
#include "bench/workloads.h"
#include "cli/commands.h"

namespace tsnap::cli {
namespace {

int run_bench(const bench::BenchOptions& o) {
  const std::string why = bench::check_options(o);
  if (!why.empty()) {
    std::cerr << "tsnap: error: " << why << '\n';
    return kExitUsage;
  }
  bench::WorkDir work(o.dir);
  bench::Progress progress;
  progress.show("building the state...");
  bench::Workload workload = bench::make_workload(o.preset, o.size, o.tensors);
  const bench::StateInfo info{workload.description,
                              bench::output_bytes(workload.state, std::nullopt),
                              workload.state.size()};
  // The largest file at any moment is one state's worth (raw file, snapshot or torch file);
  // --timeline: the newest snapshot and the one before it, until the newest commits.
  work.require_free((o.timeline ? 2 : 1) * (info.fp32_bytes + info.fp32_bytes / 10) +
                    (64ull << 20));

  if (o.timeline) {
    const bench::Timeline tl = bench::run_timeline(o, workload.state, work.path(), progress);
    progress.done();
    bench::print_timeline(o, info, tl);
    if (!o.plot.empty()) bench::plot_timeline(o, tl, work.path());
  } else {
    const std::vector<bench::PointResult> results =
        bench::run_sweep(o, workload.state, work.path(), progress);
    progress.done();
    bench::print_points(o, info, results);
    if (!o.plot.empty()) bench::plot_points(o, results, work.path());
  }
  if (!o.plot.empty()) std::cerr << "plot written to " << o.plot << '\n';
  return kExitOk;
}

}  // namespace

Command add_bench(CLI::App& app) {
  auto o = std::make_shared<bench::BenchOptions>();
  CLI::App* sub = app.add_subcommand("bench", "Measure checkpoint throughput (like fio)");
  sub->footer(
      "Compares, in interleaved repetitions: the raw device (sequential write + fsync and read "
      "of an equal-size file through the same io engine, no staging), tsnap save (stall, "
      "durable time, GB/s) and tsnap::load, torch::save + fsync and torch::load. Loads run "
      "cold (files evicted from the page cache) and warm (files read once). Files go to a "
      "temporary "
      "directory inside --dir, removed on exit.\n"
      "Examples:\n"
      "  tsnap bench --preset gpt2-small --size 0.1 --reps 2\n"
      "  tsnap bench --sweep chunk=4M,16M,64M --plot chunk.png --dir /data\n"
      "  tsnap bench --timeline --steps 60 --every 10 --step-ms 100 --plot timeline.png");
  bench::add_workload_options(*sub, *o);
  bench::add_pipeline_options(*sub, *o);
  bench::add_run_options(*sub, *o, "Target directory (on the device to measure)");
  bench::add_report_options(*sub, *o);
  bench::add_timeline_options(*sub, *o);
  return {sub, [o] { return run_bench(*o); }};
}

}  // namespace tsnap::cli
