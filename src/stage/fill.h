#pragma once
// Staging one chunk: copies (and converts) the bytes of a shard file's byte image that fall in
// one chunk into a staging buffer: the header where it overlaps, then every tensor slice,
// split into pieces of at most kPieceBytes so that one huge tensor and many small ones both
// spread over the TBB arena the caller runs in.

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "plan/plan.h"

namespace tsnap::stage {

/// Output bytes per parallel piece.
inline constexpr uint64_t kPieceBytes = 1ull << 20;

/// The tensors of one shard file, ready to be read by fill_chunk. Index-aligned with
/// file.tensors. CPU tensors are made contiguous; device tensors (CUDA, ...) are converted to
/// their stored dtype and made contiguous on their device, on the caller's current stream, and
/// `ready` holds one event per device recorded after that work, which the side streams of
/// fill_chunk wait on.
struct Sources {
  std::vector<at::Tensor> tensors;
  std::vector<std::pair<c10::Device, std::shared_ptr<c10::Event>>> ready;
};

/// Prepares the sources of `file` (on the caller's thread).
Sources prepare_sources(const plan::PlannedFile& file);

/// Fills `buf` with bytes [chunk_begin, chunk_end) of `file`'s image and returns that length.
/// CPU slices are copied/converted with tbb::parallel_for (call it inside the arena); device
/// slices are copied with non-blocking device-to-host copies on a side stream from the
/// device's pool (pinned staging memory makes them asynchronous), and the chunk waits for that
/// stream before returning. Throws what the copy throws.
uint64_t fill_chunk(const plan::PlannedFile& file, const Sources& sources, uint64_t chunk,
                    uint8_t* buf);

}  // namespace tsnap::stage
