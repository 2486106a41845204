#pragma once
/// \file
/// `tsnap::PeriodicSnapshots`: a hook for a training loop that takes asynchronous snapshots on a
/// `Schedule` (every N steps, every T seconds, on preemption signals), applies retention, and
/// resumes from the newest valid snapshot.
/// ```
/// tsnap::SnapshotterOptions options;
/// options.root = "runs/exp1";
/// tsnap::Snapshotter snap(options);
/// tsnap::ScheduleOptions when;
/// when.every_steps = 500;
/// when.every_seconds = 600;
/// when.on_signals = {SIGTERM, SIGUSR1};
/// when.keep_last = 3;
/// tsnap::Schedule every(when);
/// tsnap::PeriodicSnapshots hook(snap, every, [&] {
///   return tsnap::Checkpoint::of({{"model", model}, {"optim", tsnap::bind(opt, model)},
///                                 {"rng", tsnap::rng_state()}});
/// });
/// int64_t step = hook.resume([&](tsnap::Checkpoint& c) {   // 0 when there is nothing to resume
///   c.apply({{"model", model}, {"optim", tsnap::bind(opt, model)}, {"rng", tsnap::rng_state()}});
/// });
/// while (step < total) {
///   train_step();                     // forward, backward, optimizer.step()
///   hook.after_step(++step);          // saves when due; blocks at most for the staging copy
///   if (hook.stop_requested()) break; // a signal came: the final snapshot is committed
/// }
/// hook.finish();                      // waits for the save in flight, logs a summary
/// ```
/// Steps count completed optimizer steps: the snapshot `step-00000500` holds the state after 500
/// steps, and `resume` returns 500 for it.

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "tsnap/export.h"
#include "tsnap/save_handle.h"
#include "tsnap/save_options.h"
#include "tsnap/schedule.h"

namespace tsnap {

class Checkpoint;
class Snapshotter;

/// What `after_step` does when a snapshot is due while the previous one is still writing.
enum class WhenBusy {
  kSkip,  ///< Skip this snapshot (counted in PeriodicStats::skipped); training never waits.
  kWait,  ///< Wait for the previous one to commit, then save (the step stalls for the write).
};

/// Why a snapshot was taken.
enum class SnapshotReason {
  kSteps,       ///< every_steps or at_steps.
  kTime,        ///< every_seconds.
  kSignal,      ///< A signal of on_signals: the final snapshot.
  kContinuous,  ///< continuous or max_overhead (adaptive).
};

/// "steps", "time", "signal" or "continuous".
TSNAP_API const char* to_string(SnapshotReason reason) noexcept;

/// The figures of one snapshot the hook took.
struct TSNAP_API SnapshotRecord {
  int64_t step = 0;
  std::string name;  ///< Directory name under the root, e.g. "step-00001200".
  SnapshotReason reason = SnapshotReason::kSteps;
  /// How long `after_step` blocked training for it: make_checkpoint, the wait for the previous
  /// save (WhenBusy::kWait), the staging copy; for a signal's snapshot also its commit.
  double blocked_s = 0;
  SaveStats save;          ///< stall, stage, write, commit and total times, bytes, engine.
  bool committed = false;  ///< False when the save failed (see `error`).
  std::string error;       ///< The failure's message, empty when committed.
  std::vector<std::string> deleted;  ///< Snapshots retention deleted after this one committed.
};

/// A SnapshotRecord as a JSON object: "step", "name", "reason", "blocked_s", "committed",
/// "error", "deleted" and "save" (the SaveStats, see to_json(SaveStats)).
TSNAP_API void to_json(nlohmann::json& out, const SnapshotRecord& record);

/// The figures of a hook so far. Value type.
struct TSNAP_API PeriodicStats {
  std::vector<SnapshotRecord> snapshots;  ///< In order of completion.
  int64_t skipped = 0;     ///< Snapshots due while the previous one was writing (WhenBusy::kSkip).
  int64_t failed = 0;      ///< Snapshots whose save failed.
  int64_t deleted = 0;     ///< Snapshots removed by retention.
  double stall_s() const;  ///< Total time after_step blocked training (sum of blocked_s).
  uint64_t bytes() const;  ///< Total bytes written by committed snapshots.
};

/// Options of a PeriodicSnapshots hook. In C++17:
/// `tsnap::PeriodicOptions o; o.save.dtype = at::kBFloat16; o.when_busy = WhenBusy::kWait;`.
/// Designated initialisers need C++20 (or GCC's and Clang's extension in C++17, which
/// -pedantic warns about): `{.save = {.dtype = at::kBFloat16}, .when_busy = WhenBusy::kWait}`.
struct TSNAP_API PeriodicOptions {
  /// Options of each save. `overwrite` is always on: a snapshot left by an abandoned run at the
  /// same step (e.g. one that was corrupt, so `resume` went back further) is replaced atomically.
  /// With `Staging::kLazy`, call `before_optimizer_step()` before the tensors next change.
  SaveOptions save;
  WhenBusy when_busy = WhenBusy::kSkip;
  /// Each save's step is its SaveOptions::step. With `stale_check` and an empty
  /// `save.stale.must_change`, every save checks the optimizer's moments
  /// (optimizer_moment_keys()): when some did not change while the step advanced, the log says
  /// so in a warning (or, with `save.stale.fail`, the save fails and nothing is committed).
  /// Give `save.stale.must_change` to check other keys; false: no check.
  bool stale_check = true;
  /// Receives one line per event (snapshot committed or failed, skipped, resumed, summary).
  /// Calls never overlap; they come from the training thread, the hook's thread or (two tiers)
  /// the Snapshotter's drain thread, and must not call back into the hook. Null: no log. Default:
  /// `log_to_stderr`.
  std::function<void(const std::string&)> log = log_to_stderr;
  /// Receives each snapshot's record once it has committed or failed (and retention ran), for
  /// a training logger (`nlohmann::json j = record;`). Same threads and rules as `log`; an
  /// exception it throws is swallowed. Null: no calls.
  std::function<void(const SnapshotRecord&)> on_snapshot;

  /// Writes `line` and a newline to stderr.
  static void log_to_stderr(const std::string& line);
};

/// Takes snapshots of what `make_checkpoint` returns when the Schedule says so, at the step
/// boundaries the loop reports with `after_step`.
///
/// Time and signals: the hook owns a thread running an Asio io_context. A `steady_timer` on it
/// only sets a flag, and an Asio `signal_set` for `on_signals` only records the signal; every save
/// starts at a step boundary on the training thread. A signal makes the next `after_step` take a
/// final snapshot, wait for it to commit, and turn `stop_requested()` true.
///
/// Signal chaining: a handler function installed before the hook for one of its signals is
/// called (on the hook's thread, when the signal arrives, with a siginfo that holds only the
/// signal number and SI_USER) and stays installed in the sense that the hook restores every
/// previous disposition when it is destroyed. A previous SIG_DFL or SIG_IGN is not acted on: the
/// hook's final snapshot and stop replace the default action while it lives; to end with the
/// conventional status, re-raise `stop_signal()` after destroying the hook.
///
/// Retention (ScheduleOptions' keep rules; metrics come from each snapshot's metadata, so give
/// them to Checkpoint::of in `make_checkpoint`) runs on the hook's thread after each
/// snapshot commits, and deletes crash-safely (rename to a temporary name, then remove), so a
/// crash at any moment leaves at least one complete snapshot. Stale temporaries of crashed
/// writers are removed when a Snapshotter starts alone on the root (a `flock` on the root).
/// With a two-tier Snapshotter (SnapshotterOptions::tier.durable_root) retention runs after each
/// drain instead, on the drain thread: the keep rules on the durable root, then on the local
/// root, where a snapshot not drained yet is never deleted (the Snapshotter's tier.local_keep_last
/// applies there too). `resume` considers both roots (on a tie the local copy; the durable copy
/// when the local one fails to load), and `finish` also waits for the drain.
///
/// Distributed (the Snapshotter has a DistGroup; every rank runs the same hook and calls
/// `after_step` with the same steps): steps-based snapshots are taken by every rank at the same
/// steps; a time-based snapshot (rank 0's clock) or a signal (on any rank) is posted to the group
/// as a snapshot at a step a little ahead (about 0.5 s of training, at least 3 steps), which
/// every rank takes; a signal on one rank so stops every rank after the same final snapshot.
/// A due snapshot always waits for the previous one (WhenBusy::kSkip would let ranks decide
/// differently); rank 0 alone applies retention; `resume` picks the same snapshot on every rank
/// (they read the same root). On node-local roots (TierOptions::node_local) every rank calls
/// `resume` and they agree through the group's store on one snapshot: the newest that every
/// rank can load (a node's copy that holds every file, or the durable copy); a rank that cannot
/// load it, or a failed agreement, throws Error(kPeerFailed) naming why.
///
/// Errors of background saves do not interrupt training: they are logged, counted, and thrown
/// by `finish()`; the final snapshot's error is thrown by the `after_step` that took it.
///
/// Thread-safety: `resume`, `after_step`, `before_optimizer_step` and `finish` are for the
/// training thread; `stop_requested`, `stop_signal` and `stats` may be called from any thread.
/// One hook per signal per process. Ownership: refers to the Snapshotter, which must outlive the
/// hook. Destruction waits for the save in flight to complete (never throws), stops the thread
/// and restores the previous signal dispositions.
class TSNAP_API PeriodicSnapshots {
 public:
  using MakeCheckpoint = std::function<Checkpoint()>;
  using ApplyCheckpoint = std::function<void(Checkpoint&)>;

  /// Starts the hook's thread, its timer and its signal handlers. `make_checkpoint` is called on
  /// the training thread at each save and returns what to save (e.g. Checkpoint::of(...)); the
  /// hook adds the step to its metadata as "step". Errors: InvalidArgument for a null
  /// `make_checkpoint`; IoError when a signal handler cannot be installed.
  PeriodicSnapshots(Snapshotter& snapshotter, Schedule schedule, MakeCheckpoint make_checkpoint,
                    PeriodicOptions options = {});
  ~PeriodicSnapshots();
  PeriodicSnapshots(const PeriodicSnapshots&) = delete;
  PeriodicSnapshots& operator=(const PeriodicSnapshots&) = delete;

  /// Loads the newest valid snapshot under the root (highest integer metadata "step", then
  /// newest; temporaries, directories without a valid manifest, and snapshots whose chunks fail
  /// verification are skipped, each logged), passes it to `apply`, and returns its step; returns
  /// 0 and does not call `apply` when there is none. Errors: whatever `apply` throws; IoError
  /// when the root cannot be listed.
  int64_t resume(const ApplyCheckpoint& apply);

  /// Reports that `step` steps are complete (call it after optimizer.step()). Starts a snapshot
  /// when one is due (by steps, by time, or by a signal): eager saves block for the staging copy
  /// only. A snapshot due while the previous one is writing is skipped or waited for (WhenBusy);
  /// a signal's final snapshot always waits for the previous one, then for its own commit.
  /// The first call also sizes and faults in the Snapshotter's staging buffers for the
  /// checkpoint (Snapshotter::prepare; a no-op with a fixed budget), so that the first snapshot
  /// stalls like the later ones: that step pays it once (1.5 GB: 0.2-0.7 s on 2 cores).
  /// Does nothing once `stop_requested()`. Errors: those of `make_checkpoint` and of
  /// `Snapshotter::save_async` (bad options); the final snapshot's save error.
  void after_step(int64_t step);

  /// For Staging::kLazy: waits until the last snapshot is staged, so the tensors may change (call
  /// it right before optimizer.step()). Returns at once for eager saves. Errors: the staging error.
  void before_optimizer_step();

  /// True once a signal arrived and its final snapshot committed (or failed).
  bool stop_requested() const;
  /// The signal that stopped training, 0 while none has.
  int stop_signal() const;

  /// Waits for the save in flight and its retention (two tiers: and for the drain, see
  /// Snapshotter::drain_wait), logs a summary line and returns the stats. Errors: the first
  /// error of a background save that was not thrown already, else a drain failure not thrown
  /// yet (the stats stay available through `stats()`).
  PeriodicStats finish();

  /// The figures so far (complete for every snapshot that has finished).
  PeriodicStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tsnap
