#pragma once
// A cheap guess at whether a tensor changed between two saves, for the layout of an
// incremental save that has no chunk signatures to compare yet (plan::Layout::unchanged).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace tsnap::plan {

/// Bytes read from the tensor: kSampleBlocks blocks of kSampleBlockBytes, spread evenly.
inline constexpr uint64_t kSampleBlocks = 32;
inline constexpr uint64_t kSampleBlockBytes = 64;

/// The XXH3-64 of a contiguous CPU tensor's dtype, shape and kSampleBlocks blocks of its bytes
/// spread evenly over it (all of it when it is that small): a few microseconds, whatever its size.
/// A training step moves nearly every element of what it trains, so equal samples at two
/// saves mean, with rare exceptions (a sparse update that misses every block), a frozen
/// tensor. Only the layout trusts it: a wrong guess costs bytes, never correctness, since
/// reuse is still proven chunk by chunk. Nullopt for other tensors (device, strided, sparse):
/// reading them is not cheap.
std::optional<uint64_t> sample_hash(const at::Tensor& t);

}  // namespace tsnap::plan
