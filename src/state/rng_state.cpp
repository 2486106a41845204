#include "tsnap/rng_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <mutex>
#include <utility>
#include <vector>

#include "state/apply.h"

namespace tsnap {
namespace {

// The process's default generators by name: "cpu", then "cuda:<i>" per device.
std::vector<std::pair<std::string, at::Generator>> generators() {
  std::vector<std::pair<std::string, at::Generator>> out;
  out.emplace_back("cpu", at::detail::getDefaultCPUGenerator());
  if (at::hasCUDA()) {
    const int devices = at::detail::getCUDAHooks().getNumGPUs();
    for (int i = 0; i < devices; ++i) {
      out.emplace_back("cuda:" + std::to_string(i),
                       at::globalContext().defaultGenerator(
                           at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(i))));
    }
  }
  return out;
}

at::Tensor get_state(at::Generator& generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

}  // namespace

RngState rng_state() {
  RngState state;
  for (auto& [name, generator] : generators()) state.generators.insert(name, get_state(generator));
  return state;
}

void set_rng_state(const RngState& state) {
  detail::ApplyPlan plan;
  detail::plan_rng(state.generators, "", plan);
  plan.finish(/*strict=*/true, "set_rng_state");
}

namespace detail {

void plan_rng(const StateDict& state, const std::string& prefix, ApplyPlan& plan) {
  auto current = generators();
  for (auto& [name, generator] : current) {
    if (!state.contains(name)) {
      plan.missing(prefix + name);
      continue;
    }
    const at::Tensor& source = state.at(name);
    const at::Tensor now = get_state(generator);
    if (source.scalar_type() != at::kByte || source.sizes() != now.sizes()) {
      plan.mismatch(prefix + name, std::string(c10::toString(source.scalar_type())) + " " +
                                       shape_string(source.sizes()) + " in state, generator has " +
                                       "Byte " + shape_string(now.sizes()));
      continue;
    }
    // An init-capture: clang before 16 cannot capture a structured binding by name.
    plan.then(prefix + name, [generator = generator, source]() mutable {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(source.cpu().contiguous());
    });
  }
  for (const auto& [name, entry] : state) {
    bool known = false;
    for (const auto& g : current) known = known || g.first == name;
    if (!known) plan.unexpected(prefix + name);
  }
}

}  // namespace detail
}  // namespace tsnap
