#pragma once
// The save benchmark: one "point" is a snapshotter set up one way and a number of interleaved
// repetitions, each of which measures, in this order,
//   raw      sequential write (+ fsync) and, optionally, read of an equal-size file through an
//            io engine of the snapshotter's kind, chunk size and queue depth (RawIo);
//   tsnap    for each stored dtype asked for: save_async + wait (stall, staging, durable time,
//            process CPU time), the 2-thread memcpy of the same output bytes (the stall's
//            floor), and optionally tsnap::load of the snapshot just written;
//   torch    torch::save + fsync and, optionally, torch::load of the same tensors.
// `tsnap bench` and `tsnap_bench_save` both measure through run(), so that their figures come
// from one code path. Also here: the save benchmark's small-versus-large tensors and RSS soak.

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "bench/measure.h"
#include "bench/options.h"
#include "tsnap/snapshotter.h"
#include "tsnap/state_dict.h"

namespace tsnap::bench {

class Progress;

/// One measured quantity: seconds per repetition and the bytes each repetition moved.
struct Measure {
  std::string key;    ///< for JSON / CSV ("tsnap_stall"; other dtypes than the first: "_bf16")
  std::string label;  ///< for tables
  Series s;
  double bytes = 0;
  /// bytes / median seconds / 1e9; 0 without repetitions.
  double gbps() const { return s.empty() || s.median() <= 0 ? 0 : bytes / s.median() / 1e9; }
};

/// What a point measures; see the file comment for the order within a repetition.
struct PointSpec {
  SnapshotterOptions snapshotter;  ///< its root is where every file of the point goes
  /// Stored dtypes of the floating tensors (unset: as they are), each saved in every
  /// repetition. The first gets the plain measure keys, the others a "_<dtype>" suffix.
  std::vector<std::optional<at::ScalarType>> dtypes = {std::nullopt};
  bool lazy = false;  ///< Staging::kLazy (and measure call-to-staged)
  int reps = 3;
  bool raw_read = true;    ///< read the raw file back
  bool restore = true;     ///< tsnap::load of each snapshot of the first dtype
  bool torch_save = true;  ///< torch::save + fsync
  bool torch_load = true;  ///< torch::load of that file (with torch_save)
  std::string value;       ///< the swept parameter's value ("" without a sweep)
  std::string progress;    ///< prefix of the progress lines, e.g. "[threads=2] "
};

/// The figures of one point.
struct PointResult {
  std::string value;   ///< PointSpec::value
  std::string engine;  ///< the snapshotter's engine, e.g. "io_uring+O_DIRECT"
  std::vector<Measure> m;
  Series cpu_s;                 ///< process CPU seconds during a save of the first dtype
  long rss_after_pool_kib = 0;  ///< RSS right after the snapshotter (its pool) was built
  /// The measure called `key`; std::logic_error if there is none.
  Measure& get(const std::string& key);
  const Measure& get(const std::string& key) const;
  /// The measure called `key` if it has repetitions, else null.
  const Measure* find(const std::string& key) const;
};

/// Runs points over one state. Thread-safety: none. Ownership: keeps references to `state` and
/// `progress`, which must outlive it; owns the memcpy floor's destination buffer.
class SaveRunner {
 public:
  SaveRunner(const StateDict& state, Progress& progress);
  /// Measures one point; `index` tells its snapshots apart from other points'. Every file it
  /// writes is removed before it returns. Errors: whatever the pipeline, the raw io or
  /// torch::save throw.
  PointResult run(const PointSpec& spec, size_t index);

 private:
  const StateDict& state_;
  Progress& progress_;
  std::vector<uint8_t> floor_;  // the memcpy floor's destination, warm, grown on demand
};

/// `tsnap bench`'s points: the pipeline, dtype and contenders that `o` describes, once per value
/// of its --sweep (once without one), over `state`, with files under `work`.
/// Errors: those of SaveRunner::run.
std::vector<PointResult> run_sweep(const BenchOptions& o, const StateDict& state,
                                   const std::filesystem::path& work, Progress& progress);

/// The suffix of a dtype's measure keys and labels ("f32", "bf16", "f16").
std::string dtype_suffix(std::optional<at::ScalarType> dtype);

/// Durable saves of 10,000 small tensors (4-64 KiB) and of 8 large tensors of the same total.
/// `ratio`: each repetition's large durable time over its small one (throughput of small over
/// large), paired so that the disk's drift between repetitions cancels.
struct SmallVsLarge {
  uint64_t bytes = 0;
  Series small, large, small_stall, large_stall, small_commit, large_commit, ratio;
};

/// Saves the small and the large state through `snap` `reps` times each, interleaved (small
/// first in even repetitions, large first in odd ones), and removes the snapshots.
SmallVsLarge run_small_vs_large(Snapshotter& snap, int reps);

/// RSS after each of a series of saves of the same state (overwriting one snapshot).
struct Soak {
  int saves = 0;
  long first_kib = 0, last_kib = 0, min_kib = 0, max_kib = 0;
};

/// Saves `state` through `snap` `saves` times and records the RSS after each; removes the
/// snapshot.
Soak run_soak(Snapshotter& snap, const StateDict& state, int saves);

}  // namespace tsnap::bench
