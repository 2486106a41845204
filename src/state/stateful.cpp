#include "tsnap/stateful.h"

#include <torch/optim/schedulers/lr_scheduler.h>

#include <limits>
#include <string>

#include "tsnap/error.h"

namespace tsnap {
namespace {

// LRScheduler keeps its step count in a protected member without an accessor. A pointer to it
// may be formed through a derived class (the class is never instantiated), and then used on any
// scheduler.
struct StepCountAccess : torch::optim::LRScheduler {
  static auto member() { return &StepCountAccess::step_count_; }
};

}  // namespace

StatefulState SchedulerState::state_dict() const {
  return {{}, {{"step_count", (*scheduler_).*StepCountAccess::member()}}};
}

void SchedulerState::load_state_dict(const StatefulState& state) {
  auto count = state.values.find("step_count");
  const bool fits = count != state.values.end() && count->is_number_integer() &&
                    (count->is_number_unsigned() || count->get<int64_t>() >= 0) &&
                    count->get<uint64_t>() <= std::numeric_limits<unsigned>::max();
  if (!fits) {
    throw_error(ErrorCode::kInvalidArgument,
                "LR scheduler state needs an unsigned integer \"step_count\", not " +
                    (count == state.values.end() ? std::string("nothing") : count->dump()));
  }
  (*scheduler_).*StepCountAccess::member() = count->get<unsigned>();
}

}  // namespace tsnap
