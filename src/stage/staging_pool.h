#pragma once
// A fixed set of aligned staging buffers, allocated once and reused by every save
// (docs/architecture.md, "Memory"). Pinned host memory when LibTorch has CUDA. acquire() blocks
// while all buffers are in use: that is the backpressure that bounds a save's memory to the budget.
// A wait for a buffer first calls the reclaim hook, when one is set (set_reclaim), to get back
// buffers that nothing else would return: a Snapshotter's hook evicts hot images and releases
// the writes an eager save holds back while it stages.
//
// Faulting in: making the pool maps its memory and returns (microseconds). Each buffer's pages
// are faulted in once, before its first use, by whichever comes first: fault_in_now() (every
// buffer at once, on every core: what a Snapshotter does when it makes its pool, so that no
// save, the first included, copies into fresh pages), a background thread
// (fault_in_background(), in the reverse of the order acquire() hands buffers out), or the
// acquire() that first hands it out (in-kernel, on that caller).
//
// Thread-safety: all methods are thread-safe. Ownership: owns the memory; buffers handed out
// stay valid until the pool is destroyed, which must happen after every buffer is released.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/anon_memory.h"

namespace tsnap::stage {

class StagingPool {
 public:
  /// `count` buffers of `buffer_bytes` (a multiple of 4096) each. `pinned` asks for page-locked
  /// memory (falls back to plain aligned memory if unavailable).
  StagingPool(size_t count, size_t buffer_bytes, bool pinned);
  /// The same in shared memory (common/anon_memory.h, never pinned): a new memfd when
  /// `shared_fd` < 0, else the memfd `shared_fd` of a pool of this geometry that another
  /// process made (its buffers' bytes are kept: a snapshot agent hands them on).
  StagingPool(size_t count, size_t buffer_bytes, int shared_fd);
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  /// A free buffer's index, its pages faulted in; blocks until one is free. `waited` is set
  /// when it had to wait for a release.
  int acquire(bool* waited = nullptr);
  /// Faults in every buffer not faulted in yet, now, split over one thread per core (the
  /// caller's included); returns when all are ready. 1.5 GB took 0.3-0.45 s on a 2-core VM.
  void fault_in_now();
  /// Starts the background thread that faults in the buffers no acquire() has yet (at a lower
  /// CPU and I/O priority when `background_priority`), collapses the pool into huge pages
  /// where the kernel can (common/anon_memory.h), then calls `done` on that thread (e.g.
  /// to register the buffers with io_uring, which pins their pages). `done` must not throw;
  /// it does not run when stop_background() came first or no thread could start. Once a pool.
  void fault_in_background(bool background_priority, std::function<void()> done);
  /// Stops and joins the background thread (a no-op without one); `done` is not running and
  /// will not run once this returns. The destructor calls it; call it earlier when `done` uses
  /// something that dies before the pool.
  void stop_background();
  /// Marks a save's staging under way while it lives: the background thread's collapse into
  /// huge pages (a copy of each buffer) waits meanwhile, so that it takes no core and no memory
  /// bandwidth from the copies the caller is waiting for (a first save right after the pool
  /// was made stalled 1.2-1.4x the later ones without this, on 2 ranks sharing 2 cores).
  class Staging {
   public:
    explicit Staging(StagingPool& pool) : pool_(pool) { ++pool_.staging_; }
    ~Staging() { --pool_.staging_; }
    Staging(const Staging&) = delete;
    Staging& operator=(const Staging&) = delete;

   private:
    StagingPool& pool_;
  };
  /// Hands out buffer `index`, which must be free, as acquire() would (never waits): for the
  /// buffers of a hot image that a pool in shared memory held when this process adopted it.
  /// Errors: kInvalidArgument when the buffer is not free.
  void take(int index);
  /// Returns a buffer to the pool.
  void release(int index);
  /// Sets what acquire() calls (without the pool's lock) when no buffer is free, before it
  /// waits, and again every kReclaimRetry while it still finds none. A Snapshotter's hook does
  /// two things (pipeline/snapshotter.cpp): it evicts the hot images (stage/hot_image.h), which
  /// gives kept buffers back, and it releases the writes held back by an eager save that is
  /// still staging (pipeline/deferred_writes.h), whose buffers come back once written. Without
  /// that release a thread waiting here (which may be staging another save's chunk in the same
  /// TBB arena) could wait forever for buffers that only those held-back writes would free.
  /// Set before the first acquire().
  void set_reclaim(std::function<void()> reclaim);
  static constexpr std::chrono::milliseconds kReclaimRetry{20};
  /// Pools up to this size are made of huge pages at once; larger ones of 4 KiB pages,
  /// collapsed into huge pages in the background (staging_pool.cpp).
  static constexpr uint64_t kSmallPool = 64ull << 20;
  /// The memory of buffer `index`.
  uint8_t* data(int index) const { return buffers_[index]; }
  size_t buffer_bytes() const { return buffer_bytes_; }
  size_t count() const { return buffers_.size(); }
  bool pinned() const { return pinned_; }
  /// The memfd of a pool in shared memory; -1 otherwise.
  int shared_fd() const { return memory_ ? memory_->fd() : -1; }
  /// Buffers that had been used at least once before (for stats).
  bool used_before(int index) const;
  /// Number of buffers currently handed out.
  size_t in_use() const;

 private:
  enum class Pages : uint8_t { kFresh, kFaulting, kReady };
  StagingPool(size_t count, size_t buffer_bytes);  // checks the geometry
  void add_buffers(uint8_t* base, size_t count);
  // Faults in buffer `index` unless someone has; `lock` holds mu_ (released while faulting).
  void fault_in(int index, std::unique_lock<std::mutex>& lock);
  // On the background thread: collapses each buffer into huge pages while it is free (taken
  // out of free_ meanwhile, and given back at once when an acquire() waits), until all are,
  // stop_background() is called, or none was free for a second (e.g. kept by hot images).
  void collapse_free_buffers();

  size_t buffer_bytes_;
  bool pinned_ = false;
  std::vector<uint8_t*> buffers_;
  std::vector<bool> used_;
  std::vector<Pages> pages_;
  std::condition_variable faulted_cv_;  // a buffer became kReady
  bool stop_ = false;
  std::thread faulter_;
  std::vector<int> free_;
  size_t collapsing_ = 0;        // buffers out of free_ while collapse_free_buffers() works
  std::atomic<int> waiters_{0};  // acquire() calls waiting for a free buffer
  std::atomic<int> staging_{0};  // saves staging (Staging)
  void* pinned_ctx_ = nullptr;   // at::DataPtr owner for pinned memory
  std::unique_ptr<detail::AnonMemory> memory_;  // the buffers when not pinned
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> reclaim_;
};

}  // namespace tsnap::stage
