#pragma once
/// \file
/// `tsnap::optimizer_state` and `tsnap::apply_optimizer_state`: an optimizer's per-parameter state
/// keyed by parameter name, its param groups' hyper-parameters, and both put back so that training
/// resumes bitwise exactly. Supports LibTorch's Adam, AdamW, SGD, RMSprop and Adagrad.

#include <nlohmann/json.hpp>
#include <type_traits>
#include <utility>

#include "tsnap/apply_report.h"
#include "tsnap/export.h"
#include "tsnap/state_dict.h"

namespace torch {
namespace nn {
class Module;
}  // namespace nn
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

namespace tsnap {

/// The state of an optimizer, named after the parameters of the module it trains.
/// Value type; the tensors refer to the optimizer's own (no copies, except `step` counters).
struct TSNAP_API OptimizerState {
  /// Per-parameter state as `<param name>/<field>`: `fc1.weight/exp_avg`, `fc1.weight/exp_avg_sq`,
  /// `fc1.weight/max_exp_avg_sq`, `momentum_buffer`, `square_avg`, `grad_avg`, `sum`, and `step`
  /// as a 0-d int64 tensor. Parameters the optimizer holds no state for yet have no keys.
  StateDict state;
  /// `{"type": "Adam", "param_groups": [{"params": ["fc1.weight", ...], "lr": 0.001,
  /// "betas": [0.9, 0.999], ...}], "stateful": ["fc1.weight", ...]}`: the hyper-parameters of
  /// each group, its parameters by name, and the parameters that have state.
  nlohmann::json config;
};

/// The state of `optimizer`, whose parameters must all be parameters of `module`.
/// Errors: Error(kUnsupported) "unsupported optimizer: <type>" for other optimizer types;
/// InvalidArgument naming the group and index of a parameter that `module` does not hold.
/// Not thread-safe with respect to `optimizer.step()`.
TSNAP_API OptimizerState optimizer_state(const torch::optim::Optimizer& optimizer,
                                         const torch::nn::Module& module);

/// Puts `state` (from `optimizer_state` on an optimizer of the same type over a module with the
/// same parameter names) into `optimizer`: the hyper-parameters of every group, and each
/// parameter's state, copied into its existing state tensors or into new state objects when the
/// optimizer has none yet (a fresh optimizer), in the parameter's dtype and device. A parameter's
/// state is applied whole or not at all; a parameter without state in `state` loses the state
/// the optimizer had for it. Strict and non-strict as in ApplyOptions; a different optimizer type
/// or different param groups are mismatches (key "param_groups").
/// Errors: InvalidArgument (kKeyNotFound, kShapeMismatch) listing every problem under strict,
/// with nothing changed. Not thread-safe with respect to other users of the optimizer.
TSNAP_API ApplyReport apply_optimizer_state(torch::optim::Optimizer& optimizer,
                                            const torch::nn::Module& module,
                                            const OptimizerState& state,
                                            const ApplyOptions& options = {});

/// An optimizer together with the module whose parameters name its state; what a Checkpoint
/// takes for an optimizer. Refers to both (they must outlive its use).
struct TSNAP_API OptimizerBinding {
  torch::optim::Optimizer* optimizer = nullptr;
  const torch::nn::Module* module = nullptr;
};

namespace detail {
/// Whether `*handle` is an nn::Module: `std::shared_ptr<Net>` or a `TORCH_MODULE` holder.
template <class Handle, class = void>
struct IsModuleHandle : std::false_type {};
template <class Handle>
struct IsModuleHandle<Handle, std::void_t<decltype(static_cast<const torch::nn::Module&>(
                                  *std::declval<const Handle&>()))>> : std::true_type {};
}  // namespace detail

/// Binds `optimizer` to `module`: `tsnap::bind(opt, model)`. Call it qualified: argument-dependent
/// lookup also finds `std::bind` (nn::Module derives from std::enable_shared_from_this).
inline OptimizerBinding bind(torch::optim::Optimizer& optimizer, const torch::nn::Module& module) {
  return {&optimizer, &module};
}
/// The same for a module handle (`std::shared_ptr<Net>`, a `TORCH_MODULE` holder).
template <class Handle, std::enable_if_t<detail::IsModuleHandle<Handle>::value, int> = 0>
OptimizerBinding bind(torch::optim::Optimizer& optimizer, const Handle& module) {
  return {&optimizer, &static_cast<const torch::nn::Module&>(*module)};
}

}  // namespace tsnap
