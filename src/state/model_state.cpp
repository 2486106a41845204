#include "tsnap/model_state.h"

#include <torch/csrc/jit/api/module.h>
#include <torch/nn/module.h>

#include <set>
#include <utility>

#include "common/glob.h"
#include "plan/plan.h"
#include "state/apply.h"
#include "tsnap/error.h"

namespace tsnap {
namespace {

// A parameter or buffer under its name.
struct Named {
  std::string name;
  at::Tensor tensor;
  bool frozen = false;  // A parameter with requires_grad() == false.
};

std::vector<Named> named_tensors(const torch::nn::Module& module) {
  std::vector<Named> named;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    named.push_back({item.key(), item.value(), !item.value().requires_grad()});
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    named.push_back({item.key(), item.value()});
  }
  return named;
}

std::vector<Named> named_tensors(const torch::jit::Module& module) {
  std::vector<Named> named;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    named.push_back({item.name, item.value, !item.value.requires_grad()});
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    named.push_back({item.name, item.value});
  }
  return named;
}

void check_options(const ModelStateOptions& options) {
  if (options.dtype && *options.dtype != at::kFloat && *options.dtype != at::kHalf &&
      *options.dtype != at::kBFloat16 && *options.dtype != at::kDouble) {
    throw_error(ErrorCode::kInvalidArgument, std::string("model_state: dtype ") +
                                                 c10::toString(*options.dtype) +
                                                 " is not one of Float, Half, BFloat16, Double");
  }
  const ShardOptions& shard = options.shard;
  if (shard.world_size < 1 || shard.rank < 0 || shard.rank >= shard.world_size || shard.dim < 0) {
    throw_error(ErrorCode::kInvalidArgument, "model_state: bad shard options (rank " +
                                                 std::to_string(shard.rank) + ", world_size " +
                                                 std::to_string(shard.world_size) + ", dim " +
                                                 std::to_string(shard.dim) + ")");
  }
}

// This rank's piece of `tensor` (a view) and where it lies, or the whole tensor when replicated.
std::pair<at::Tensor, std::optional<ShardSpec>> shard_piece(const at::Tensor& tensor,
                                                            const ShardOptions& shard) {
  if (shard.world_size == 1 || tensor.dim() <= shard.dim) return {tensor, std::nullopt};
  const int64_t size = tensor.size(shard.dim);
  const int64_t base = size / shard.world_size, extra = size % shard.world_size;
  const int64_t begin = shard.rank * base + std::min<int64_t>(shard.rank, extra);
  const int64_t length = base + (shard.rank < extra ? 1 : 0);
  ShardSpec spec{tensor.sizes().vec(), std::vector<int64_t>(tensor.dim(), 0)};
  spec.offsets[shard.dim] = begin;
  return {tensor.narrow(shard.dim, begin, length), std::move(spec)};
}

StateDict build(std::vector<Named> named, const ModelStateOptions& options) {
  check_options(options);
  std::vector<std::string> keys;
  for (const auto& n : named) keys.push_back(n.name);
  const auto selected = detail::select_keys(keys, options.include, options.exclude, options.strict);
  const std::set<std::string> take(selected.begin(), selected.end());

  StateDict state;
  for (auto& n : named) {
    if (!n.tensor.defined() || !take.count(n.name) || (n.frozen && !options.frozen)) continue;
    std::optional<at::ScalarType> dtype;
    // The precision rule: counters and scalars (0-d buffers) keep their dtype.
    if (options.dtype && at::isFloatingType(n.tensor.scalar_type()) &&
        !plan::is_counter(n.name, n.tensor)) {
      dtype = options.dtype;
    }
    auto [piece, spec] = shard_piece(n.tensor, options.shard);
    state.insert(std::move(n.name), std::move(piece), dtype, std::move(spec));
  }
  return state;
}

std::vector<std::pair<std::string, at::Tensor>> destinations(std::vector<Named> named) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& n : named) {
    if (n.tensor.defined()) out.emplace_back(std::move(n.name), std::move(n.tensor));
  }
  return out;
}

}  // namespace

StateDict model_state(const torch::nn::Module& module, const ModelStateOptions& options) {
  return build(named_tensors(module), options);
}

StateDict model_state(const torch::jit::Module& module, const ModelStateOptions& options) {
  return build(named_tensors(module), options);
}

ApplyReport apply_model_state(const torch::nn::Module& module, const StateDict& state,
                              const ApplyOptions& options) {
  detail::ApplyPlan plan;
  detail::plan_module(module, state, "", plan);
  return plan.finish(options.strict, "apply_model_state");
}

ApplyReport apply_model_state(const torch::jit::Module& module, const StateDict& state,
                              const ApplyOptions& options) {
  detail::ApplyPlan plan;
  detail::plan_module(module, state, "", plan);
  return plan.finish(options.strict, "apply_model_state");
}

namespace detail {

void plan_module(const torch::nn::Module& module, const StateDict& state, const std::string& prefix,
                 ApplyPlan& plan) {
  plan_tensors(destinations(named_tensors(module)), state, prefix, plan);
}

void plan_module(const torch::jit::Module& module, const StateDict& state,
                 const std::string& prefix, ApplyPlan& plan) {
  plan_tensors(destinations(named_tensors(module)), state, prefix, plan);
}

}  // namespace detail
}  // namespace tsnap
