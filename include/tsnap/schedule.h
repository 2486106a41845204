#pragma once
/// \file
/// `tsnap::Schedule`: when a `PeriodicSnapshots` hook takes a snapshot (every N steps, every T
/// seconds, on a signal) and which committed snapshots its retention keeps.

#include <cstdint>
#include <vector>

#include "tsnap/export.h"

namespace tsnap {

/// What a Schedule holds. Designated initialisers read well:
/// `{.every_steps = 500, .every_seconds = 600, .on_signals = {SIGTERM, SIGUSR1}, .keep_last = 3,
///   .keep_every_steps = 10000}`.
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
};

/// When to snapshot and what to keep: a validated ScheduleOptions and the two decisions a hook
/// makes from it. Thread-safety: immutable, so any use from any thread. Ownership: a value type.
class TSNAP_API Schedule {
 public:
  /// Checks `options`. Errors: InvalidArgument for a negative count or period, a non-finite
  /// period, or a signal that cannot be caught (outside 1..NSIG-1, SIGKILL, SIGSTOP) or repeated.
  explicit Schedule(ScheduleOptions options);

  const ScheduleOptions& options() const { return options_; }

  /// True when a snapshot is due by step count after `step` completed steps (a positive multiple
  /// of `every_steps`).
  bool due_at_step(int64_t step) const;

  /// Retention: of the committed snapshots at `steps` (any order, no repeats), the ones to delete:
  /// every step that is neither among the `keep_last` highest nor a multiple of
  /// `keep_every_steps`. Returned in ascending order; empty when `keep_last` is 0.
  std::vector<int64_t> expired(std::vector<int64_t> steps) const;

 private:
  ScheduleOptions options_;
};

}  // namespace tsnap
