// Save-pipeline benchmark. In one run, repetitions
// interleaved so that the disk's drift hits every contender alike (bench/runner.h, the runner
// of `tsnap bench` too):
//   raw     sequential O_DIRECT write of an equal-size file with the same engine, same chunk
//           size and queue depth, from warm aligned buffers, then fsync (the device's limit);
//   tsnap   save_async + wait: stall (time save_async blocks) and durable time (call ->
//           committed), for the state as fp32 and as bf16;
//   memcpy  a plain 2-thread memcpy of the same output bytes into warm buffers (the stall's
//           floor);
//   torch   torch::save + fsync of the same tensors.
// Also: 10,000 small tensors vs large tensors of the same total, and RSS over N saves.
// Prints medians and min..max, and the ratios the pipeline issue targets.

#include <CLI/CLI.hpp>
#include <cstdio>

#include "bench/options.h"
#include "bench/report.h"
#include "bench/runner.h"
#include "bench/session.h"
#include "bench/workloads.h"

namespace tsnap::bench {
namespace {

int run(const BenchOptions& o) {
  WorkDir work(o.dir);
  Progress progress;
  SaveBenchResult result;
  result.rss_before_kib = rss_kib();
  std::printf("building GPT-2-small-like state with Adam moments (scale %.2f)...\n", o.size);
  StateDict state = gpt2_small_with_adam(o.size);
  const uint64_t f32_bytes = output_bytes(state, std::nullopt);
  std::printf("state: %zu tensors, %.3f GB fp32\n", state.size(), f32_bytes / 1e9);
  std::fflush(stdout);
  work.require_free(f32_bytes + f32_bytes / 10 + (64ull << 20));

  const SnapshotterOptions so = snapshotter_options(o, f32_bytes, work.path());
  result.spec = {.snapshotter = so,
                 .dtypes = {std::nullopt, at::kBFloat16},
                 .lazy = o.lazy,
                 .reps = o.reps,
                 .raw_read = false,
                 .restore = false,
                 .torch_save = !o.no_torch,
                 .torch_load = false};
  result.point = SaveRunner(state, progress).run(result.spec, 0);
  if (!o.no_small || o.soak > 0) {
    state = StateDict();  // room for the small-tensor states
    Snapshotter snap(so);
    if (!o.no_small) {
      progress.show("small vs large tensors...");
      result.small = run_small_vs_large(snap, o.reps);
    }
    if (o.soak > 0) {
      progress.show("soak: " + std::to_string(o.soak) + " saves...");
      result.soak = run_soak(snap, gpt2_small_with_adam(o.size), o.soak);
    }
  }
  progress.done();
  print_save_report(result);
  return 0;
}

}  // namespace
}  // namespace tsnap::bench

int main(int argc, char** argv) {
  tsnap::bench::BenchOptions o;
  o.budget = "2048M";
  return tsnap::bench::run_program(
      argc, argv, "tsnap_bench_save",
      "Save-pipeline benchmark: tsnap save against the raw device, memcpy and torch::save "
      "(docs/benchmarks.md).",
      o,
      [&](CLI::App& app) {
        tsnap::bench::add_pipeline_options(app, o);
        app.add_option("--soak", o.soak, "Also record the RSS over N saves")
            ->check(CLI::Range(0, 100000));
        app.add_flag("--no-small", o.no_small, "Skip small against large tensors");
      },
      [&] { return tsnap::bench::run(o); });
}
