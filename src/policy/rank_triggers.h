#pragma once
/// \file
/// How the ranks of a distributed periodic hook agree on the snapshots due by time or by a signal
/// (docs/architecture.md, "Distributed saves"). The rank that decides one posts a trigger
/// through the group's store for a step a little ahead (kLeadSeconds of training at the pace of
/// the fastest recent step, at least kMinLeadSteps); every rank's hook thread polls the
/// triggers every 50 ms, and every rank saves at that step. A trigger that a rank learns of only
/// after passing its step fails that save on every rank. When the store cannot be reached (the
/// rank hosting it has ended) the triggers end: logged once, no more store calls.
///
/// Thread-safety: `start_polling` runs before the io_context's thread does, the polls and
/// `cancel` on that thread; `add_step_time`, `propose` and `take` on the training thread;
/// `ended` on any. Ownership: refers to the coordinator and the io_context, which
/// must outlive it; `log` is called from both threads.

#include <array>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dist/coordinator.h"
#include "tsnap/periodic_snapshots.h"

namespace tsnap::policy {

/// A snapshot the group agreed on: due at `step` for `reason` (`sig`: the signal's number).
struct Trigger {
  int64_t step;
  SnapshotReason reason;
  int sig;
};

class RankTriggers {
 public:
  static constexpr double kLeadSeconds = 0.5;
  static constexpr int64_t kMinLeadSteps = 3;

  RankTriggers(dist::Coordinator& coord, boost::asio::io_context& io,
               std::function<void(const std::string&)> log);
  RankTriggers(const RankTriggers&) = delete;
  RankTriggers& operator=(const RankTriggers&) = delete;

  /// Polls the triggers posted so far (on the calling thread), then every 50 ms on the
  /// io_context's thread until `cancel` or until the store fails.
  void start_polling();
  /// Stops the polls. A poll whose timer had already expired (its handler queued with success,
  /// which cancelling a timer cannot take back) finds `cancelled_` and does not wait again.
  void cancel() {
    cancelled_ = true;
    poll_timer_.cancel();
  }

  /// Whether the group's store could not be reached: nothing can be agreed any more.
  bool ended() const { return ended_.load(); }

  /// The training's own time of one step (between after_step calls, without the hook's), kept
  /// for the last kStepWindow steps; a trigger's lead counts the fastest of them.
  void add_step_time(double seconds);

  /// Posts a trigger for a step ahead of `step` and returns that step. A store that cannot be
  /// reached ends the triggers (ended()) and is not an error.
  int64_t propose(int64_t step, SnapshotReason reason, int sig);

  /// The triggers polled so far that are due at or before `step`, removed: `due`, the one due at
  /// `step` (a signal's before any other), and `missed`, those of earlier steps, each of which
  /// has been logged and reported to the group as failed (its save fails on every rank).
  struct Taken {
    std::optional<Trigger> due;
    std::vector<Trigger> missed;
  };
  Taken take(int64_t step);

 private:
  static constexpr size_t kStepWindow = 16;

  void poll();
  void end(const std::string& why);
  double fastest_step_s() const;

  dist::Coordinator& coord_;
  boost::asio::steady_timer poll_timer_;
  bool cancelled_ = false;  // on the io_context's thread only
  const std::function<void(const std::string&)> log_;
  int64_t next_ = 0;  // hook thread: the index of the next trigger to poll
  std::atomic<bool> ended_{false};
  std::mutex mu_;
  std::deque<Trigger> agreed_;                    // guarded by mu_; ascending steps
  std::array<double, kStepWindow> step_times_{};  // training thread
  size_t steps_timed_ = 0;                        // training thread
};

}  // namespace tsnap::policy
