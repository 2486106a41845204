#pragma once
// The training-loop timeline of `tsnap bench --timeline`: a simulated training loop on the
// workload state, run twice in interleaved blocks of --every steps (each block without
// snapshots, then again with a save_async after its first step), recording each step's wall
// time and the stall of the snapshot steps. A step is "compute"
// (in-place mul_/add_ passes over scratch copies of some of the state's tensors, standing for
// forward/backward and the gradients: the state itself is left alone, so a lazy save may stage
// while it runs) and then an "optimizer step" that changes every floating tensor of the state in
// place, so each snapshot must be point-in-time exact. The number of compute passes is
// calibrated in warm-up steps so that a step takes about --step-ms.

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/options.h"
#include "tsnap/state_dict.h"

namespace tsnap::bench {

class Progress;

/// One step of both runs.
struct StepRecord {
  double without_s = 0;
  double with_s = 0;
  double stall_s = 0;      // save_async + wait_staged (lazy) inside this step
  bool snapshot = false;   // a save started at the end of this step
  bool in_flight = false;  // a save was still writing when this step ended
};

/// One snapshot of the run with snapshots.
struct SaveRecord {
  std::string name;
  int step = 0;
  double stall_s = 0;  // save_async + wait_staged, wherever they fell
  double durable_s = 0;
  uint64_t bytes = 0;
};

/// Both runs and the calibration of their steps.
struct Timeline {
  std::string engine;
  int passes = 0;
  int every = 1;  // steps per block (--every)
  uint64_t scratch_bytes = 0;
  double pass_ms = 0;
  double optimizer_ms = 0;
  std::vector<StepRecord> steps;
  std::vector<SaveRecord> saves;
  /// Mean step time of the run with (`with`) or without snapshots, seconds.
  double mean(bool with) const {
    double t = 0;
    for (const StepRecord& s : steps) t += with ? s.with_s : s.without_s;
    return steps.empty() ? 0 : t / static_cast<double>(steps.size());
  }
  /// How much longer the mean step is with snapshots, percent.
  double overhead_pct() const { return mean(false) > 0 ? (mean(true) / mean(false) - 1) * 100 : 0; }
  /// The median over blocks of --every steps of each block's overhead (its steps with a
  /// snapshot against the same steps without, run just before): robust to a block that
  /// the machine slowed down, percent.
  double block_overhead_median_pct() const {
    std::vector<double> v;
    const size_t n = static_cast<size_t>(std::max(every, 1));
    for (size_t b = 0; b < steps.size(); b += n) {
      double without = 0, with = 0;
      for (size_t i = b; i < std::min(steps.size(), b + n); ++i) {
        without += steps[i].without_s;
        with += steps[i].with_s;
      }
      if (without > 0) v.push_back((with / without - 1) * 100);
    }
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  }
  /// The longest stall of a save, seconds.
  double max_stall() const {
    double m = 0;
    for (const SaveRecord& s : saves) m = std::max(m, s.stall_s);
    return m;
  }
};

/// Runs the timeline that `o` describes (--steps, --every, --step-ms, --lazy, --dtype and the
/// pipeline options) on `state`, whose floating tensors it changes in place, with snapshots
/// under `work`; only the newest committed snapshot is kept while it runs, and none after.
/// Errors: whatever the pipeline throws.
Timeline run_timeline(const BenchOptions& o, StateDict& state, const std::filesystem::path& work,
                      Progress& progress);

}  // namespace tsnap::bench
