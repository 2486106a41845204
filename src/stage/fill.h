#pragma once
// Staging one chunk: copies (and converts) the bytes of a shard file's byte image that fall in
// one chunk into a staging buffer: the header where it overlaps, then every tensor slice,
// split into pieces of at most kPieceBytes so that one huge tensor and many small ones both
// spread over the TBB arena the caller runs in.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "plan/plan.h"

namespace tsnap::stage {

/// Output bytes per parallel piece.
inline constexpr uint64_t kPieceBytes = 1ull << 20;

/// The tensors of `file` ready to be read by fill_chunk: contiguous, and on the CPU unless a
/// device copy is needed (then converted to the stored dtype on their device). Index-aligned
/// with file.tensors. Runs conversions on the caller's thread.
std::vector<at::Tensor> prepare_sources(const plan::PlannedFile& file);

/// Fills `buf` with bytes [chunk_begin, chunk_end) of `file`'s image and returns that length.
/// Uses tbb::parallel_for (call it inside the arena). Throws what the copy throws.
uint64_t fill_chunk(const plan::PlannedFile& file, const std::vector<at::Tensor>& sources,
                    uint64_t chunk, uint8_t* buf);

}  // namespace tsnap::stage
