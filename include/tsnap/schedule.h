#pragma once
/// \file
/// `tsnap::Schedule`: when a `PeriodicSnapshots` hook takes a snapshot (every N steps, every T
/// seconds, at given steps, continuously, adaptively, on a signal) and which committed snapshots
/// its retention keeps (the newest N, every N steps, one per T seconds, the best N by a metric).
/// The vocabulary follows Orbax's CheckpointManager save decision and preservation policies;
/// several save rules combine (any of them makes a snapshot due) and so do keep rules (a
/// snapshot is kept when any rule keeps it).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tsnap/export.h"

namespace tsnap {

/// What a Schedule holds. In C++17:
/// ```
/// tsnap::ScheduleOptions o;
/// o.every_steps = 500;
/// o.every_seconds = 600;
/// o.on_signals = {SIGTERM, SIGUSR1};
/// o.keep_last = 3;
/// o.keep_every_steps = 10000;
/// ```
/// Designated initialisers need C++20 (or GCC's and Clang's extension in C++17, which
/// -pedantic warns about): `{.every_steps = 500, .every_seconds = 600, .on_signals = {SIGTERM,
/// SIGUSR1}, .keep_last = 3, .keep_every_steps = 10000}`.
/// Steps count completed training steps: step 500 is the state after 500 optimizer steps.
struct TSNAP_API ScheduleOptions {
  /// Snapshot after every step that is a multiple of this; 0 = never by step count.
  int64_t every_steps = 0;
  /// Snapshot at the first step boundary at least this many seconds after the previous one was
  /// taken or skipped (or after the hook started); 0 = never by time.
  double every_seconds = 0;
  /// Signals that ask for a final snapshot and a stop (preemption), e.g. {SIGTERM, SIGUSR1}.
  std::vector<int> on_signals;
  /// Keep the K newest committed snapshots (by step); 0 = keep all.
  int keep_last = 0;
  /// Also keep, forever, the snapshots whose step is a multiple of M; 0 = none.
  int64_t keep_every_steps = 0;

  /// Also snapshot after exactly these steps (any order).
  std::vector<int64_t> at_steps;
  /// Continuous: snapshot at the first step boundary once the previous snapshot has committed
  /// (or failed) and at least `min_interval_seconds` after it began (after the hook started,
  /// for the first).
  bool continuous = false;
  double min_interval_seconds = 0;
  /// Adaptive (CheckFreq): continuous, spaced so that the time snapshots block training stays
  /// within this fraction of the time between them: the next one begins no sooner than the
  /// last one's blocked time divided by `max_overhead` (nor sooner than min_interval_seconds).
  /// E.g. 0.01 for 1 %. 0 = off; > 0 implies `continuous`.
  double max_overhead = 0;

  /// Keep one snapshot per window of this many seconds of creation time: from the oldest on,
  /// each one created at least this long after the last one so kept. 0 = none.
  double keep_every_seconds = 0;
  /// Keep the N snapshots with the best value of the number `best_metric` in their metadata
  /// (put it in the Checkpoint's metadata: `Checkpoint::of(objects, {{"val_loss", v}})`).
  /// 0 = none.
  int keep_best = 0;
  std::string best_metric;
  enum class Mode { kMin, kMax };
  Mode best_mode = Mode::kMin;  ///< kMin: lower is better (a loss); kMax: higher (accuracy).
  /// With keep_best: also keep the snapshots whose metadata has no such number (else they go,
  /// unless another rule keeps them).
  bool keep_without_metric = true;
};

/// What retention knows of one committed snapshot.
struct TSNAP_API SnapshotFacts {
  int64_t step = 0;
  double created_s = 0;          ///< Creation time, seconds since the Unix epoch.
  std::optional<double> metric;  ///< Its `best_metric`, if its metadata has that number.
};

/// When to snapshot and what to keep: a validated ScheduleOptions and the two decisions a hook
/// makes from it. Thread-safety: immutable, so any use from any thread. Ownership: a value type.
class TSNAP_API Schedule {
 public:
  /// Checks `options`. Errors: InvalidArgument for a negative count, step or period, a non-finite
  /// period, a max_overhead outside [0, 1), keep_best without best_metric, or a signal that
  /// cannot be caught (outside 1..NSIG-1, SIGKILL, SIGSTOP) or repeated.
  explicit Schedule(ScheduleOptions options);

  const ScheduleOptions& options() const { return options_; }

  /// True when a snapshot is due by step count after `step` completed steps (a positive multiple
  /// of `every_steps`, or one of `at_steps`).
  bool due_at_step(int64_t step) const;

  /// Continuous and adaptive saving: the least time in seconds from the start of one snapshot
  /// to the start of the next, given the last one's blocked time; nullopt when neither is on.
  std::optional<double> continuous_interval(double last_blocked_s) const;

  /// Whether retention deletes anything at all: keep_last, keep_every_seconds or keep_best is
  /// set (keep_every_steps alone keeps everything, as does no rule).
  bool retains() const;

  /// Retention: of the committed snapshots (any order, no repeated steps), the steps to delete:
  /// those that no rule keeps. Rules: the `keep_last` highest steps; multiples of
  /// `keep_every_steps`; one per `keep_every_seconds` window; the `keep_best` by metric (and,
  /// with keep_without_metric, those without one). The highest step is always kept. Returned in
  /// ascending order; empty when `retains()` is false.
  std::vector<int64_t> expired(std::vector<SnapshotFacts> snapshots) const;

 private:
  ScheduleOptions options_;
};

}  // namespace tsnap
