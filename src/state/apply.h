#pragma once
// Applying state to objects in two phases, so that a strict apply changes nothing when anything
// is wrong: every object first records its problems and queues its changes in one ApplyPlan,
// then `finish` either throws (strict, with problems) or runs the queued changes.

#include <ATen/core/Tensor.h>

#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/shape.h"
#include "tsnap/apply_report.h"
#include "tsnap/state_dict.h"

namespace torch {
namespace nn {
class Module;
}  // namespace nn
namespace jit {
struct Module;
}  // namespace jit
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

namespace tsnap::detail {

/// Problems found and changes queued by the planning phase. Single-threaded.
class ApplyPlan {
 public:
  void missing(std::string key) { report_.missing.push_back(std::move(key)); }
  void unexpected(std::string key) { report_.unexpected.push_back(std::move(key)); }
  void mismatch(std::string key, std::string reason) {
    report_.mismatched.push_back({std::move(key), std::move(reason)});
  }
  /// Queues `action`, which applies the state of `key` (reported as applied unless empty); it
  /// runs only in `finish`.
  void then(std::string key, std::function<void()> action) {
    actions_.emplace_back(std::move(key), std::move(action));
  }
  /// Checks that `entry` fits `destination` (the piece its ShardSpec names, if any): same shape,
  /// same kind of dtype (floating, integer, bool, complex). Queues an in-place copy if so, else
  /// records a mismatch; returns whether it fits.
  bool copy(const std::string& key, const StateEntry& entry, const at::Tensor& destination);

  /// Strict with problems: throws InvalidArgument listing them all (kShapeMismatch if any
  /// mismatch, else kKeyNotFound) and runs nothing. Otherwise runs the queued changes in order
  /// without recording autograd history and returns the report (every list sorted). `what` names
  /// the call.
  ApplyReport finish(bool strict, const std::string& what);

 private:
  ApplyReport report_;
  std::vector<std::pair<std::string, std::function<void()>>> actions_;
};

/// Named destinations against a state: a missing key per absent destination, an unexpected key
/// per entry without destination, an in-place copy per fitting pair. Report keys are
/// `prefix + key`.
void plan_tensors(const std::vector<std::pair<std::string, at::Tensor>>& destinations,
                  const StateDict& state, const std::string& prefix, ApplyPlan& plan);

/// A model's parameters and buffers as destinations (model_state.cpp).
void plan_module(const torch::nn::Module& module, const StateDict& state, const std::string& prefix,
                 ApplyPlan& plan);
void plan_module(const torch::jit::Module& module, const StateDict& state,
                 const std::string& prefix, ApplyPlan& plan);

/// An optimizer's state and hyper-parameters (optimizer_state.cpp); `config` as in
/// OptimizerState::config.
void plan_optimizer(torch::optim::Optimizer& optimizer, const torch::nn::Module& module,
                    const StateDict& state, const nlohmann::json& config, const std::string& prefix,
                    ApplyPlan& plan);

/// The process's default generators (rng_state.cpp).
void plan_rng(const StateDict& state, const std::string& prefix, ApplyPlan& plan);

}  // namespace tsnap::detail
