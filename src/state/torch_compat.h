#pragma once
// Every difference between the LibTorch releases tsnap supports (Debian's 1.13 and 2.x from the
// torch wheel) that the code must know about lives here, decided from the types LibTorch
// declares rather than from version macros, so that a release that changes one of them fails
// to compile here and nowhere else.
//
// - Optimizer state: `Optimizer::state()` is keyed by the parameter's TensorImpl address,
//   printed as a string in 1.13 and as a `void*` in 2.x.
// Release differences that other code avoids instead of wrapping (so they need nothing here):
// `c10::str` no longer prints std::vector (common/shape.h spells shapes), CUDA generators are
// reached through `at::globalContext().defaultGenerator(device)` (the CUDA hooks renamed theirs),
// and LibTorch 2.x's CMake config raises C++17 to C++20 (the code is valid in both).

#include <ATen/core/Tensor.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace tsnap::compat {

/// The key of `param` in an optimizer state map of type `StateMap` (`Optimizer::state()`).
template <class StateMap>
typename StateMap::key_type optimizer_state_key(const at::Tensor& param) {
  using Key = typename StateMap::key_type;
  void* impl = param.unsafeGetTensorImpl();
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;  // LibTorch 1.x: c10::guts::to_string(impl), i.e. operator<<
    out << impl;
    return out.str();
  } else {
    static_assert(std::is_same_v<Key, void*>, "unknown optimizer state key type");
    return impl;
  }
}

}  // namespace tsnap::compat
