#include "policy/rank_triggers.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <utility>

#include "common/sys_error.h"
#include "format/layout.h"
#include "pipeline/rank_report.h"
#include "tsnap/error.h"

namespace tsnap::policy {

RankTriggers::RankTriggers(dist::Coordinator& coord, boost::asio::io_context& io,
                           std::function<void(const std::string&)> log)
    : coord_(coord), poll_timer_(io), log_(std::move(log)) {}

void RankTriggers::start_polling() { poll(); }

void RankTriggers::poll() {
  try {
    for (;;) {
      const std::string text = coord_.poll_trigger(next_);
      if (text.empty()) break;
      ++next_;
      const nlohmann::json j = nlohmann::json::parse(text);
      const std::string reason = j.at("reason").get<std::string>();
      const Trigger t{j.at("step").get<int64_t>(),
                      reason == "signal"       ? SnapshotReason::kSignal
                      : reason == "continuous" ? SnapshotReason::kContinuous
                                               : SnapshotReason::kTime,
                      j.value("signal", 0)};
      // Kept in step order: triggers come in posting order, but each proposer picks its own
      // lead, so a later trigger can be due earlier.
      std::lock_guard<std::mutex> lock(mu_);
      agreed_.insert(
          std::upper_bound(agreed_.begin(), agreed_.end(), t,
                           [](const Trigger& a, const Trigger& b) { return a.step < b.step; }),
          t);
    }
  } catch (const std::exception& e) {
    end(e.what());
    return;  // no more polls: the group has ended
  }
  if (cancelled_) return;
  poll_timer_.expires_after(std::chrono::milliseconds(50));
  poll_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec && !cancelled_) poll();
  });
}

void RankTriggers::end(const std::string& why) {
  if (ended_.exchange(true)) return;
  log_(
      "tsnap: the group's store cannot be reached (the rank that hosts it, usually rank 0, has "
      "ended?): this rank's periodic snapshots stop: " +
      detail::first_line(why));
}

void RankTriggers::add_step_time(double seconds) {
  step_times_[steps_timed_++ % kStepWindow] = seconds;
}

double RankTriggers::fastest_step_s() const {
  const size_t n = std::min(steps_timed_, kStepWindow);
  if (n == 0) return 0;
  return *std::min_element(step_times_.begin(), step_times_.begin() + static_cast<ptrdiff_t>(n));
}

int64_t RankTriggers::propose(int64_t step, SnapshotReason reason, int sig) {
  // The other ranks must see the trigger (their hook threads poll every 50 ms) before they pass
  // its step, or their training collectives would wait for ranks that stopped. Counting the
  // fastest recent step, not an average, keeps the lead at least kLeadSeconds when steps speed
  // up after slow ones (a step that waited for a save).
  const double fastest = fastest_step_s();
  const int64_t lead = std::clamp<int64_t>(
      fastest > 0 ? static_cast<int64_t>(std::ceil(kLeadSeconds / fastest)) : kMinLeadSteps,
      kMinLeadSteps, 10000);
  const nlohmann::json t = {{"step", step + lead},
                            {"reason", to_string(reason)},
                            {"signal", sig},
                            {"rank", coord_.rank()}};
  try {
    coord_.post_trigger(t.dump());
  } catch (const std::exception& e) {
    end(e.what());
  }
  return step + lead;
}

RankTriggers::Taken RankTriggers::take(int64_t step) {
  Taken taken;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!agreed_.empty() && agreed_.front().step <= step) {
      const Trigger t = agreed_.front();
      agreed_.pop_front();
      if (t.step < step) {
        taken.missed.push_back(t);
      } else if (!taken.due || t.reason == SnapshotReason::kSignal) {
        taken.due = t;
      }
    }
  }
  for (const Trigger& t : taken.missed) {
    const std::string what = "rank " + std::to_string(coord_.rank()) + " learned of the " +
                             to_string(t.reason) + " snapshot at step " + std::to_string(t.step) +
                             " only at step " + std::to_string(step);
    log_("tsnap: " + what + ": it fails on every rank");
    // Report this save failed, so that the others fail now, not on the group's timeout.
    const std::string name = format::step_name(t.step);
    pipeline::report_no_part(coord_, coord_.save_id(name), name,
                             make_error(ErrorCode::kPeerFailed, what));
  }
  return taken;
}

}  // namespace tsnap::policy
