#pragma once
/// \file
/// `tsnap::model_state` and `tsnap::apply_model_state`: a model's parameters and buffers as a
/// StateDict (no copies), and that state copied back into a model in place.

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tsnap/apply_report.h"
#include "tsnap/export.h"
#include "tsnap/state_dict.h"

namespace torch {
namespace nn {
class Module;
}  // namespace nn
namespace jit {
struct Module;
}  // namespace jit
}  // namespace torch

namespace tsnap {

/// Which piece of each tensor one rank holds when state is sharded across ranks. Each tensor of
/// at least `dim + 1` dimensions is split along `dim` into `world_size` contiguous pieces whose
/// sizes differ by at most one (the first `size % world_size` pieces are one larger); tensors with
/// fewer dimensions are replicated: every rank holds them whole, without a ShardSpec.
struct TSNAP_API ShardOptions {
  int rank = 0;
  int world_size = 1;  ///< 1 = not sharded.
  int64_t dim = 0;
};

/// Options of `model_state`. In C++17:
/// `tsnap::ModelStateOptions o; o.dtype = at::kBFloat16; o.exclude = {"*.bias"};`. Designated
/// initialisers need C++20 (or GCC's and Clang's extension in C++17, which -pedantic warns
/// about): `{.dtype = at::kBFloat16, .exclude = {"*.bias"}}`.
struct TSNAP_API ModelStateOptions {
  /// Store floating tensors as this dtype (kFloat, kHalf, kBFloat16 or kDouble), recorded in each
  /// entry's `StateEntry::dtype`; integer and bool tensors (e.g. BatchNorm's
  /// `num_batches_tracked`) keep theirs. Unset keeps every dtype.
  std::optional<at::ScalarType> dtype;
  /// Glob patterns (`*`, `?`, `[a-z]`, `[!x]`; `*` also matches '.') of keys to take; empty = all.
  std::vector<std::string> include;
  /// Glob patterns of keys to leave out. Not together with `include`.
  std::vector<std::string> exclude;
  /// Make a pattern that matches no key an error.
  bool strict = false;
  /// Take frozen parameters (`requires_grad() == false`); buffers are always taken.
  bool frozen = true;
  /// This rank's pieces (see ShardOptions); each piece records its global shape and offsets.
  ShardOptions shard;
};

/// The parameters and buffers of `module` and its submodules, keyed as `named_parameters()` and
/// `named_buffers()` name them ("encoder.0.weight"); undefined tensors are skipped.
/// The entries refer to the module's tensors (or views of them when sharded): nothing is copied,
/// so the state follows the module until a save stages it.
/// Errors: InvalidArgument for a non-floating `dtype`, include with exclude, a malformed pattern,
/// bad shard options, or (strict) a pattern that matches nothing. Thread-safe for concurrent
/// readers of the module.
TSNAP_API StateDict model_state(const torch::nn::Module& module,
                                const ModelStateOptions& options = {});
/// The same for a TorchScript module (e.g. from `torch::jit::load`).
TSNAP_API StateDict model_state(const torch::jit::Module& module,
                                const ModelStateOptions& options = {});

/// Copies `state` into the parameters and buffers of `module` in place (same storage, so
/// optimizers keep pointing at them), converting each tensor to its destination's dtype and
/// device, without recording autograd history. An entry with a ShardSpec is copied into its
/// piece of the destination. See ApplyOptions for strict and non-strict behaviour.
/// Errors: InvalidArgument (kKeyNotFound or kShapeMismatch) listing every problem under strict.
/// Not thread-safe with respect to other users of the module.
TSNAP_API ApplyReport apply_model_state(const torch::nn::Module& module, const StateDict& state,
                                        const ApplyOptions& options = {});
TSNAP_API ApplyReport apply_model_state(const torch::jit::Module& module, const StateDict& state,
                                        const ApplyOptions& options = {});

}  // namespace tsnap
