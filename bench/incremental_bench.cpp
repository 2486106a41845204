// Incremental-save benchmark. A fine-tuning
// state (GPT-2 small's parameters frozen, a trained head with Adam moments that is 10 % of the
// bytes; bench/workloads.h) is saved after each simulated step twice, interleaved: a full save
// and an incremental one (SaveOptions::incremental) on separate roots. Prints medians of the
// bytes each save put on disk and its durable time (call -> committed), and their ratios.

#include <ATen/ATen.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "bench/measure.h"
#include "bench/options.h"
#include "bench/session.h"
#include "bench/workloads.h"
#include "tsnap/remove.h"
#include "tsnap/snapshotter.h"

namespace tsnap::bench {
namespace {

struct Figures {
  Series written, linked, durable, stall;
  void add(const SaveStats& s) {
    written.add(static_cast<double>(s.written_bytes));
    linked.add(static_cast<double>(s.linked_bytes));
    durable.add(s.total_s);
    stall.add(s.stall_s);
  }
};

void print_row(const char* name, const Figures& f) {
  std::printf(
      "  %-12s written %8.1f MB  linked %8.1f MB  durable %6.3f s (%.3f..%.3f)  "
      "stall %6.3f s\n",
      name, f.written.median() / 1e6, f.linked.median() / 1e6, f.durable.median(), f.durable.min(),
      f.durable.max(), f.stall.median());
}

int run(const BenchOptions& o, bool interleaved) {
  WorkDir work(o.dir);
  std::printf("building the %sfine-tuning state (scale %.2f)...\n",
              interleaved ? "interleaved " : "", o.size);
  FineTuning ft = interleaved ? interleaved_fine_tuning(o.size) : gpt2_fine_tuning(o.size);
  uint64_t changed = 0;
  for (const std::string& key : ft.trained) changed += ft.state.at(key).nbytes();
  const uint64_t bytes = ft.state.nbytes();
  std::printf("state: %zu tensors, %.3f GB fp32, trained %zu of them\n", ft.state.size(),
              bytes / 1e9, ft.trained.size());
  std::fflush(stdout);
  work.require_free(4 * (bytes + bytes / 10) + (64ull << 20));
  SnapshotterOptions full_options = snapshotter_options(o, bytes, work.path() / "full");
  SnapshotterOptions inc_options = snapshotter_options(o, bytes, work.path() / "incremental");
  full_options.incremental = false;
  inc_options.incremental = true;
  Snapshotter full(full_options), inc(inc_options);
  const auto name = [](int i) { return "s" + std::to_string(i); };
  full.save_async(name(0), ft.state).wait();
  inc.save_async(name(0), ft.state).wait();  // the first lays out the files: a full write
  Figures f_full, f_inc;
  for (int rep = 1; rep <= o.reps; ++rep) {
    for (const std::string& key : ft.trained) ft.state.at(key).add_(1);  // a training step
    for (int which = 0; which < 2; ++which) {
      const bool incremental = (which + rep) % 2 == 0;  // alternate who goes first
      Snapshotter& snap = incremental ? inc : full;
      SaveHandle h = snap.save_async(name(rep), ft.state);
      h.wait();
      (incremental ? f_inc : f_full).add(h.stats());
      if (incremental) {
        std::printf(
            "  incremental save %d: written %.1f MB = %.3f x the changed tensors' "
            "%.1f MB, linked %.1f MB\n",
            rep, h.stats().written_bytes / 1e6,
            static_cast<double>(h.stats().written_bytes) / changed, changed / 1e6,
            h.stats().linked_bytes / 1e6);
      }
      remove_snapshot(snap.root() / name(rep - 1));
    }
    std::printf("  rep %d/%d done\n", rep, o.reps);
    std::fflush(stdout);
  }
  std::printf("\nincremental vs full saves of a fine-tuning state, medians of %d (engine %s):\n",
              o.reps, full.engine_name().c_str());
  print_row("full", f_full);
  print_row("incremental", f_inc);
  std::printf("ratios: bytes written %.3f x (target <= 0.15), durable time %.3f x\n",
              f_inc.written.median() / f_full.written.median(),
              f_inc.durable.median() / f_full.durable.median());
  return 0;
}

}  // namespace
}  // namespace tsnap::bench

int main(int argc, char** argv) {
  tsnap::bench::BenchOptions o;
  o.reps = 5;
  bool interleaved = false;
  return tsnap::bench::run_program(
      argc, argv, "tsnap_bench_incremental",
      "Incremental saves: bytes written and durable time of an incremental save of a "
      "fine-tuning state against a full save (docs/benchmarks.md).",
      o,
      [&](CLI::App& app) {
        tsnap::bench::add_chunk_option(app, o);
        app.add_flag("--interleaved", interleaved,
                     "Frozen and trained tensors interleaved by name (8 frozen 2048^2 layers, "
                     "each with a trained adapter and its Adam moments)");
      },
      [&] { return tsnap::bench::run(o, interleaved); });
}
