#pragma once
// Reads of a hot snapshot: a ReadPlan served from the staging buffers that still hold a
// committed snapshot's chunks (stage/hot_image.h), with the checks, hashing and scatter of every
// read (restore/chunk_source.h) and no I/O.

#include <vector>

#include "restore/read_chunks.h"
#include "stage/hot_image.h"

namespace tsnap::restore {

/// Reads `plan` (made from `targets` of `image`'s manifest, whole chunks) from a hot image's
/// staging buffers: the same checks, hashing and scatter as read_chunks, no I/O. The caller
/// pins `image` for the call. Uses options.verify and atomic (which needs no read buffers
/// here). Errors: as tsnap::load_into (kHashMismatch naming the file "(hot, in memory)").
ReadStats read_hot_chunks(const stage::HotImage& image, const std::vector<Target>& targets,
                          const ReadPlan& plan, const LoadOptions& options, bool in_place);

}  // namespace tsnap::restore
