#pragma once
// Reads straight into new tensors (`load`): for each file of a read plan, one anonymous
// mapping (detail::AnonMemory) laid out like the file's bytes between its first and last chunk
// read (an "image" of that span), into which the chunks are read where they lie in the file,
// O_DIRECT or through the page cache alike, and verified in place. The new tensors of the
// targets that take their stored dtype whole are views of the image: nothing is copied, and
// the pages are faulted in by the reads themselves, on the engine's threads while other reads
// are in flight, instead of by copies out of read buffers.
//
// 4 KiB pages, not huge pages: on this project's VMs (free page reporting to the host), fresh
// 2 MiB pages cost 2-10x more than they save whenever the memory was freed a while before, and
// a pread through the page cache into a huge-page region that was not populated first ran
// 4-10x slower (docs/benchmarks.md, "Restore").
//
// An image is used for a file only when the tensors taken from it fill most of the span, so
// that a load of a few keys does not hold the bytes of the others; the other targets keep
// their own tensors and are copied into as before.

#include <cstdint>
#include <memory>
#include <vector>

#include "common/anon_memory.h"
#include "restore/read_plan.h"

namespace tsnap::restore {

/// Lays out images for `plan` (made from `targets`): for each file whose whole targets in
/// their stored dtype (no runs, target dtype == stored dtype, not yet given data) fill at least
/// half of the span of its chunks, makes an image of the span, points those chunks' `dest` at
/// their place in it, and those targets' `data` at theirs, with `read_in_place` set. Returns,
/// per target, the image its data lies in (null for the targets left alone).
/// Errors: those of detail::AnonMemory.
std::vector<std::shared_ptr<detail::AnonMemory>> read_into_images(ReadPlan& plan,
                                                                  std::vector<Target>& targets);

}  // namespace tsnap::restore
