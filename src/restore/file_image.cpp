#include "restore/file_image.h"

#include <algorithm>
#include <string>

namespace tsnap::restore {
namespace {

constexpr uint64_t kBlock = 4096;
constexpr uint64_t kMinFill = 2;  // the taken tensors fill at least 1/kMinFill of the span

uint64_t align_up(uint64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

// Whether targets[i] can have the image's bytes as its own: the whole stored tensor, in its
// dtype, and the only target of its key (those of a key are adjacent; a key assembled from
// pieces has several).
bool takes_whole(const std::vector<Target>& targets, size_t i) {
  const Target& t = targets[i];
  const std::string& name = t.record->name;
  const bool sole = (i == 0 || targets[i - 1].record->name != name) &&
                    (i + 1 == targets.size() || targets[i + 1].record->name != name);
  return sole && t.data == nullptr && t.runs.empty() && t.dtype == t.record->dtype &&
         t.record->begin != t.record->end;
}

}  // namespace

std::vector<std::shared_ptr<detail::AnonMemory>> read_into_images(ReadPlan& plan,
                                                                  std::vector<Target>& targets) {
  std::vector<std::shared_ptr<detail::AnonMemory>> images(targets.size());
  for (size_t f = 0; f < plan.files.size(); ++f) {
    // The span of the file's reads, and the bytes of the targets it could give whole.
    uint64_t lo = UINT64_MAX, hi = 0;
    for (const ChunkRead& c : plan.chunks) {
      if (c.file != f) continue;
      lo = std::min(lo, c.offset);
      hi = std::max(hi, c.offset + c.length);
    }
    if (hi <= lo) continue;
    const std::string& name = plan.files[f]->name;
    uint64_t taken = 0;
    std::vector<size_t> whole;
    for (size_t i = 0; i < targets.size(); ++i) {
      if (targets[i].record->file == name && takes_whole(targets, i)) {
        whole.push_back(i);
        taken += targets[i].record->nbytes();
      }
    }
    if (taken == 0 || taken * kMinFill < hi - lo) continue;
    // lo is a chunk's (or an O_DIRECT block's) offset: 4096-aligned, as is every read's place.
    // 4 KiB pages, faulted in by the reads (file_image.h).
    auto image =
        std::make_shared<detail::AnonMemory>(align_up(hi) - lo, /*huge=*/false, "loaded tensors");
    for (ChunkRead& c : plan.chunks) {
      if (c.file == f) c.dest = image->data() + (c.offset - lo);
    }
    for (size_t i : whole) {
      Target& t = targets[i];
      t.data = image->data() + (t.record->begin - lo);
      t.read_in_place = true;
      images[i] = image;
    }
  }
  return images;
}

}  // namespace tsnap::restore
