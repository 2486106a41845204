#include "restore/read_hot_chunks.h"

#include <algorithm>
#include <string>
#include <thread>

#include "restore/chunk_source.h"

namespace tsnap::restore {
namespace {

class HotChunks : public ChunkSource {
 public:
  HotChunks(const ReadPlan& plan, const stage::HotImage& image) : plan_(plan), image_(image) {
    for (const FileRecord* f : plan.files) {
      checks_.emplace_back(*f, (image.path() / f->name).string() + " (hot, in memory)",
                           "the hot copy in memory");
    }
  }
  void fetch(size_t job, int, io::Done done) override {
    done(static_cast<int>(plan_.chunks[job].length));
  }
  const uint8_t* data(size_t job, int) const override {
    const ChunkRead& c = plan_.chunks[job];
    return image_.chunk(*plan_.files[c.file], c.chunk) +
           (c.offset - c.chunk * checks_[c.file].file().chunk_bytes);
  }
  const ChunkCheck& check(size_t file) const override { return checks_[file]; }

 private:
  const ReadPlan& plan_;
  const stage::HotImage& image_;
  std::vector<ChunkCheck> checks_;
};

}  // namespace

ReadStats read_hot_chunks(const stage::HotImage& image, const std::vector<Target>& targets,
                          const ReadPlan& plan, const LoadOptions& options, bool in_place) {
  ReadStats stats;
  stats.engine = "memory";
  if (plan.chunks.empty()) return stats;
  HotChunks source(plan, image);
  // Nothing to wait for: one processor per core hashes and copies. An atomic load fetches
  // every chunk at once (each is verified before any is scattered) and needs no buffer.
  const size_t n = plan.chunks.size();
  const size_t cores = std::max(1u, std::thread::hardware_concurrency());
  const size_t slots = options.atomic ? n : std::min(n, cores);
  run_reads(plan, targets, source, options, in_place, slots, std::min(n, cores) - 1);
  stats.bytes = plan.bytes;
  return stats;
}

}  // namespace tsnap::restore
