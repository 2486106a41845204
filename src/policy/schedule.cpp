#include "tsnap/schedule.h"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <string>

#include "tsnap/error.h"

namespace tsnap {
namespace {

[[noreturn]] void invalid(const std::string& what) {
  throw_error(ErrorCode::kInvalidArgument, "Schedule: " + what);
}

}  // namespace

Schedule::Schedule(ScheduleOptions options) : options_(std::move(options)) {
  const ScheduleOptions& o = options_;
  if (o.every_steps < 0) invalid("every_steps must be >= 0, not " + std::to_string(o.every_steps));
  if (!std::isfinite(o.every_seconds) || o.every_seconds < 0) {
    invalid("every_seconds must be a finite number >= 0, not " + std::to_string(o.every_seconds));
  }
  if (o.keep_last < 0) invalid("keep_last must be >= 0, not " + std::to_string(o.keep_last));
  if (o.keep_every_steps < 0) {
    invalid("keep_every_steps must be >= 0, not " + std::to_string(o.keep_every_steps));
  }
  for (int64_t step : o.at_steps) {
    if (step <= 0) invalid("at_steps must be > 0, not " + std::to_string(step));
  }
  if (!std::isfinite(o.min_interval_seconds) || o.min_interval_seconds < 0) {
    invalid("min_interval_seconds must be a finite number >= 0, not " +
            std::to_string(o.min_interval_seconds));
  }
  if (!(o.max_overhead >= 0 && o.max_overhead < 1)) {
    invalid("max_overhead must be in [0, 1), not " + std::to_string(o.max_overhead));
  }
  if (!std::isfinite(o.keep_every_seconds) || o.keep_every_seconds < 0) {
    invalid("keep_every_seconds must be a finite number >= 0, not " +
            std::to_string(o.keep_every_seconds));
  }
  if (o.keep_best < 0) invalid("keep_best must be >= 0, not " + std::to_string(o.keep_best));
  if (o.keep_best > 0 && o.best_metric.empty()) {
    invalid("keep_best needs best_metric (the metadata key of the number to rank by)");
  }
  for (size_t i = 0; i < o.on_signals.size(); ++i) {
    const int sig = o.on_signals[i];
    if (sig <= 0 || sig >= NSIG || sig == SIGKILL || sig == SIGSTOP) {
      invalid("signal " + std::to_string(sig) + " cannot be caught");
    }
    if (std::find(o.on_signals.begin(), o.on_signals.begin() + i, sig) !=
        o.on_signals.begin() + i) {
      invalid("signal " + std::to_string(sig) + " is listed twice");
    }
  }
}

bool Schedule::due_at_step(int64_t step) const {
  if (options_.every_steps > 0 && step > 0 && step % options_.every_steps == 0) return true;
  return std::find(options_.at_steps.begin(), options_.at_steps.end(), step) !=
         options_.at_steps.end();
}

std::optional<double> Schedule::continuous_interval(double last_blocked_s) const {
  const ScheduleOptions& o = options_;
  if (!o.continuous && o.max_overhead == 0) return std::nullopt;
  double interval = o.min_interval_seconds;
  if (o.max_overhead > 0) interval = std::max(interval, last_blocked_s / o.max_overhead);
  return interval;
}

bool Schedule::retains() const {
  const ScheduleOptions& o = options_;
  return o.keep_last > 0 || o.keep_every_seconds > 0 || o.keep_best > 0;
}

std::vector<int64_t> Schedule::expired(std::vector<SnapshotFacts> snapshots) const {
  std::vector<int64_t> out;
  if (!retains() || snapshots.empty()) return out;
  const ScheduleOptions& o = options_;
  std::sort(snapshots.begin(), snapshots.end(),
            [](const SnapshotFacts& a, const SnapshotFacts& b) { return a.step < b.step; });
  const size_t n = snapshots.size();
  std::vector<bool> keep(n, false);
  keep[n - 1] = true;  // the newest, always
  for (size_t i = n - std::min(n, static_cast<size_t>(o.keep_last)); i < n; ++i) keep[i] = true;
  for (size_t i = 0; i < n; ++i) {
    if (o.keep_every_steps > 0 && snapshots[i].step % o.keep_every_steps == 0) keep[i] = true;
  }
  if (o.keep_every_seconds > 0) {
    std::vector<size_t> by_time(n);
    for (size_t i = 0; i < n; ++i) by_time[i] = i;
    std::stable_sort(by_time.begin(), by_time.end(), [&](size_t a, size_t b) {
      return snapshots[a].created_s < snapshots[b].created_s;
    });
    std::optional<double> last_kept;
    for (size_t i : by_time) {
      if (!last_kept || snapshots[i].created_s >= *last_kept + o.keep_every_seconds) {
        keep[i] = true;
        last_kept = snapshots[i].created_s;
      }
    }
  }
  if (o.keep_best > 0) {
    std::vector<size_t> ranked;
    for (size_t i = 0; i < n; ++i) {
      if (snapshots[i].metric) {
        ranked.push_back(i);
      } else if (o.keep_without_metric) {
        keep[i] = true;
      }
    }
    const bool lower = o.best_mode == ScheduleOptions::Mode::kMin;
    // Best first; among equals, the newer one.
    std::stable_sort(ranked.begin(), ranked.end(), [&](size_t a, size_t b) {
      const double ma = *snapshots[a].metric, mb = *snapshots[b].metric;
      if (ma != mb) return lower ? ma < mb : ma > mb;
      return snapshots[a].step > snapshots[b].step;
    });
    for (size_t r = 0; r < ranked.size() && r < static_cast<size_t>(o.keep_best); ++r) {
      keep[ranked[r]] = true;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (!keep[i]) out.push_back(snapshots[i].step);
  }
  return out;
}

}  // namespace tsnap
