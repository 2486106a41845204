// Restore benchmark. In one run, repetitions interleaved so that the
// disk's drift hits every contender alike, for the GPT-2-small + Adam state (~1.5 GB fp32):
// raw O_DIRECT reads (a sweep of read sizes and depths: the best is the baseline) and buffered
// reads, tsnap load_into and load, torch::load, cold (files evicted from the page cache) and
// warm, and hot: the same loads from the staging buffers of the Snapshotter that saved the
// snapshot with keep_hot (bench/restore.h). Prints medians and min..max, and the ratios
// the restore issue targets.

#include <CLI/CLI.hpp>
#include <cstdio>

#include "bench/options.h"
#include "bench/report.h"
#include "bench/restore.h"
#include "bench/session.h"
#include "bench/workloads.h"

namespace tsnap::bench {
namespace {

int run(const BenchOptions& o, bool no_hot) {
  WorkDir work(o.dir);
  if (o.keep) work.keep();
  Progress progress;
  std::printf("building GPT-2-small-like state with Adam moments (scale %.2f)...\n", o.size);
  StateDict state = gpt2_small_with_adam(o.size);
  std::printf("state: %zu tensors, %.3f GB fp32\n", state.size(), state.nbytes() / 1e9);
  std::fflush(stdout);
  // The snapshot, the torch::save file and the raw file are all there at once.
  work.require_free(3 * (state.nbytes() + state.nbytes() / 10) + (64ull << 20));
  const RestoreSpec spec{.read_budget = parse_size(o.budget),
                         .chunk = parse_size(o.chunk),
                         .reps = o.reps,
                         .torch = !o.no_torch,
                         .hot = !no_hot};
  const RestoreResult r = run_restore(spec, state, work.path(), progress);
  progress.done();
  print_restore_report(spec, r);
  if (o.keep) std::printf("files kept in %s\n", work.path().c_str());
  return 0;
}

}  // namespace
}  // namespace tsnap::bench

int main(int argc, char** argv) {
  tsnap::bench::BenchOptions o;
  o.budget = "256M";
  bool no_hot = false;
  return tsnap::bench::run_program(
      argc, argv, "tsnap_bench_restore",
      "Restore benchmark: tsnap load_into and load against the raw device and torch::load, "
      "cold and warm (docs/benchmarks.md).",
      o,
      [&](CLI::App& app) {
        tsnap::bench::add_chunk_option(app, o);
        tsnap::bench::add_budget_option(app, o, "Read budget of the loads (K/M/G suffixes)", false);
        app.add_flag("--keep", o.keep, "Keep the files (the directory is printed)");
        app.add_flag("--no-hot", no_hot,
                     "Skip the hot rows (loads from a keep_hot Snapshotter's staging buffers)");
      },
      [&] { return tsnap::bench::run(o, no_hot); });
}
