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
  return options_.every_steps > 0 && step > 0 && step % options_.every_steps == 0;
}

std::vector<int64_t> Schedule::expired(std::vector<int64_t> steps) const {
  std::vector<int64_t> out;
  const size_t keep = static_cast<size_t>(options_.keep_last);
  if (keep == 0 || steps.size() <= keep) return out;
  std::sort(steps.begin(), steps.end());
  const int64_t every = options_.keep_every_steps;
  for (size_t i = 0; i + keep < steps.size(); ++i) {
    if (every > 0 && steps[i] % every == 0) continue;
    out.push_back(steps[i]);
  }
  return out;
}

}  // namespace tsnap
