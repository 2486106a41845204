#pragma once
/// \file
/// `tsnap::Stateful`: a user object (an LR scheduler, a data loader's position, a metric tracker)
/// whose state a Checkpoint saves and restores with the models and optimizers. The state is
/// tensors (saved like any other, converted and hashed) plus plain values (a JSON object, kept in
/// the manifest):
/// ```
/// struct DataPosition : tsnap::Stateful {
///   int64_t epoch = 0, batch = 0;
///   tsnap::StatefulState state_dict() const override {
///     return {{}, {{"epoch", epoch}, {"batch", batch}}};
///   }
///   void load_state_dict(const tsnap::StatefulState& s) override {
///     epoch = s.values.at("epoch");
///     batch = s.values.at("batch");
///   }
/// };
/// DataPosition data;
/// auto ckpt = tsnap::Checkpoint::of({{"model", model}, {"data", data}});
/// ```

#include <nlohmann/json.hpp>

#include "tsnap/export.h"
#include "tsnap/state_dict.h"

namespace torch::optim {
class LRScheduler;
}  // namespace torch::optim

namespace tsnap {

/// The state of a Stateful object: tensors (keys as in any StateDict; a checkpoint saves them as
/// `<object>/<key>`) and plain values (a JSON object). Value type; the tensors are references.
struct TSNAP_API StatefulState {
  StateDict tensors;
  nlohmann::json values = nlohmann::json::object();
};

/// An object that gives its state and takes it back. `Checkpoint::of` calls `state_dict()` (the
/// tensors are then copied by the save, point-in-time, like a model's parameters);
/// `Checkpoint::apply` calls `load_state_dict()` with what was saved, before it changes any model,
/// optimizer or tensor (so an exception from it leaves those unchanged).
/// Thread-safety: called on the thread that calls `of` or `apply`.
class TSNAP_API Stateful {
 public:
  virtual ~Stateful() = default;
  /// The state now. `values` must be a JSON object.
  virtual StatefulState state_dict() const = 0;
  /// Restores the state `state_dict()` gave. Throw (any exception) when it does not fit, and check
  /// before changing anything.
  virtual void load_state_dict(const StatefulState& state) = 0;
};

/// A LibTorch learning-rate scheduler (`torch::optim::StepLR` or any other subclass of
/// `torch::optim::LRScheduler`) as a Stateful object: its step count, as the `values`
/// `{"step_count": n}`. The learning rates themselves live in the optimizer's parameter groups,
/// which the optimizer's object saves and restores; so save and apply the scheduler together with
/// its optimizer. `ReduceLROnPlateauScheduler` keeps its state in private members and is not an
/// LRScheduler: wrap it in your own Stateful.
/// Ownership: refers to `scheduler`, which must outlive the returned object.
class TSNAP_API SchedulerState final : public Stateful {
 public:
  explicit SchedulerState(torch::optim::LRScheduler& scheduler) : scheduler_(&scheduler) {}
  StatefulState state_dict() const override;
  /// Errors: InvalidArgument when `values` has no unsigned integer "step_count".
  void load_state_dict(const StatefulState& state) override;

 private:
  torch::optim::LRScheduler* scheduler_;
};

}  // namespace tsnap
