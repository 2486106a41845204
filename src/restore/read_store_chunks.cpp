#include "restore/read_store_chunks.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <thread>

#include "common/thread_name.h"
#include "restore/chunk_source.h"
#include "tsnap/error.h"

namespace tsnap::restore {
namespace {

// Chunks fetched by ranged reads on a pool of its own threads (reads from a store are waits,
// not copies: more of them run than there are cores).
class StoreChunks : public ChunkSource {
 public:
  StoreChunks(const ReadPlan& plan, const StoredSnapshot& snapshot, size_t slots,
              uint64_t buf_bytes, int threads)
      : plan_(plan), snapshot_(snapshot), failures_(plan.chunks.size()) {
    buffers_.resize(slots);
    for (std::vector<uint8_t>& b : buffers_) b.resize(static_cast<size_t>(buf_bytes));
    for (const FileRecord* f : plan.files) {
      checks_.emplace_back(*f, snapshot.root().locate(snapshot.name()).string() + "/" + f->name,
                           "the stored object");
    }
    for (int i = 0; i < threads; ++i) {
      threads_.emplace_back([this] {
        detail::name_this_thread("tsnap-fetch");
        work();
      });
    }
  }
  ~StoreChunks() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  StoreChunks(const StoreChunks&) = delete;
  StoreChunks& operator=(const StoreChunks&) = delete;

  void fetch(size_t job, int slot, io::Done done) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back({job, slot, std::move(done)});
    }
    cv_.notify_one();
  }
  const uint8_t* data(size_t, int slot) const override { return buffers_[slot].data(); }
  const ChunkCheck& check(size_t file) const override { return checks_[file]; }
  std::exception_ptr failure(size_t job) const override { return failures_[job]; }

 private:
  struct Fetch {
    size_t job;
    int slot;
    io::Done done;
  };

  void work() {
    for (;;) {
      Fetch f;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        f = std::move(queue_.front());
        queue_.pop_front();
      }
      const ChunkRead& c = plan_.chunks[f.job];
      int result = static_cast<int>(c.length);
      try {
        snapshot_.root().read(snapshot_.name(), plan_.files[c.file]->name, c.offset,
                              buffers_[f.slot].data(), static_cast<size_t>(c.length));
      } catch (...) {
        failures_[f.job] = std::current_exception();  // read by a processor after done()
        result = -EIO;
      }
      f.done(result);
    }
  }

  const ReadPlan& plan_;
  const StoredSnapshot& snapshot_;
  std::vector<std::vector<uint8_t>> buffers_;
  std::vector<ChunkCheck> checks_;
  std::vector<std::exception_ptr> failures_;  // by job
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Fetch> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace

void StoredSnapshot::check_files(const std::vector<const FileRecord*>& files) {
  if (!sizes_) sizes_ = root_.file_sizes(name_);
  const std::string where = root_.locate(name_).string();
  for (const FileRecord* f : files) {
    const auto it = sizes_->find(f->name);
    if (it == sizes_->end()) {
      throw_error(ErrorCode::kNotFound,
                  "shard " + where + "/" + f->name + " does not exist (the manifest lists it)",
                  ENOENT);
    }
    if (it->second != f->size) {
      throw_error(it->second < f->size ? ErrorCode::kTruncated : ErrorCode::kBadManifest,
                  "shard " + where + "/" + f->name + " is " + std::to_string(it->second) +
                      " bytes; the manifest says " + std::to_string(f->size) +
                      (it->second < f->size ? " (truncated)" : ""));
    }
  }
}

ReadStats read_store_chunks(StoredSnapshot& snapshot, const std::vector<Target>& targets,
                            const ReadPlan& plan, const LoadOptions& options, bool in_place) {
  ReadStats stats;
  stats.engine = "ranged reads";
  if (plan.chunks.empty()) return stats;
  // Buffers are sized by the manifest only once the objects are known to be that large.
  snapshot.check_files(plan.files);
  const uint64_t buf_bytes = std::max<uint64_t>(plan.max_chunk_length, 1);
  const size_t n = plan.chunks.size();
  const size_t slots =
      options.atomic ? read_slots(plan, options, buf_bytes)
                     : std::min<size_t>(read_slots(plan, options, buf_bytes), 2 * kFetchThreads);
  const size_t cores = std::max(1u, std::thread::hardware_concurrency());
  StoreChunks source(plan, snapshot, slots, buf_bytes,
                     static_cast<int>(std::min<size_t>(kFetchThreads, n)));
  run_reads(plan, targets, source, options, in_place, slots, std::min(slots, cores) - 1);
  stats.bytes = plan.bytes;
  return stats;
}

}  // namespace tsnap::restore
