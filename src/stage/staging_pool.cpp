#include "stage/staging_pool.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/Allocator.h>

#include <algorithm>
#include <cstring>
#include <system_error>

#include "common/thread_name.h"
#include "io/thread_priority.h"
#include "stage/staging_reserve.h"
#include "tsnap/error.h"

namespace tsnap::stage {
StagingPool::StagingPool(size_t count, size_t buffer_bytes) : buffer_bytes_(buffer_bytes) {
  if (count == 0 || buffer_bytes == 0 || buffer_bytes % 4096 != 0) {
    throw_error(ErrorCode::kInvalidArgument,
                "staging pool needs at least one buffer of a multiple of 4096 bytes");
  }
}

StagingPool::StagingPool(size_t count, size_t buffer_bytes, bool pinned)
    : StagingPool(count, buffer_bytes) {
  const size_t total = count * buffer_bytes;
  uint8_t* base = nullptr;
  uint64_t faulted = 0;  // bytes at the front of the memory faulted in already
  if (pinned && at::hasCUDA()) {
    auto* dp =
        new at::DataPtr(at::detail::getCUDAHooks().getPinnedMemoryAllocator()->allocate(total));
    base = static_cast<uint8_t*>(dp->get());
    pinned_ctx_ = dp;
    pinned_ = true;
  } else {
    // Large pools in 4 KiB pages, faulted in in-kernel (the header): fresh huge pages cost
    // whatever the host makes them cost, 2-6x more than 4 KiB ones on a VM whose host took
    // freed memory back, and the pool's making is the first save's stall; the background
    // thread collapses them into huge pages afterwards, for the writes (common/anon_memory.h).
    // Small pools in huge pages at once: at worst 0.15 s for 64 MiB, and usually far less than
    // 4 KiB pages (first save of a 10 MB state in a fresh process: 5 ms against 26 ms).
    // Memory reserved ahead (staging_reserve.h) is taken first: its pages faulted in so far
    // are kept, so those buffers need no faulting here.
    Reserved reserved = stage::take(total, "staging pool");
    memory_ = reserved.memory ? std::move(reserved.memory)
                              : std::make_unique<detail::AnonMemory>(
                                    total, /*huge=*/total <= kSmallPool, "staging pool");
    base = memory_->data();
    faulted = reserved.faulted;
  }
  add_buffers(base, count);
  for (size_t i = 0; i < count && (i + 1) * buffer_bytes <= faulted; ++i) {
    pages_[i] = Pages::kReady;
  }
}

StagingPool::StagingPool(size_t count, size_t buffer_bytes, int shared_fd)
    : StagingPool(count, buffer_bytes) {
  const size_t total = count * buffer_bytes;
  memory_ = detail::AnonMemory::shared(total, shared_fd, /*huge=*/total <= kSmallPool,
                                       "tsnap-staging-pool");
  add_buffers(memory_->data(), count);
}

void StagingPool::add_buffers(uint8_t* base, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    buffers_.push_back(base + i * buffer_bytes_);
    free_.push_back(static_cast<int>(count - 1 - i));
  }
  used_.assign(count, false);
  pages_.assign(count, Pages::kFresh);
}

StagingPool::~StagingPool() {
  stop_background();
  if (pinned_ctx_ != nullptr) delete static_cast<at::DataPtr*>(pinned_ctx_);
}

void StagingPool::fault_in(int index, std::unique_lock<std::mutex>& lock) {
  while (pages_[index] == Pages::kFaulting) faulted_cv_.wait(lock);
  if (pages_[index] == Pages::kReady) return;
  pages_[index] = Pages::kFaulting;
  lock.unlock();
  detail::populate(buffers_[index], buffer_bytes_);
  lock.lock();
  pages_[index] = Pages::kReady;
  faulted_cv_.notify_all();
}

void StagingPool::fault_in_now() {
  std::unique_lock<std::mutex> lock(mu_);
  // Claims the fresh buffers, then populates each run of adjacent ones (all of them, in a
  // pool nobody has used yet) in one parallel pass.
  std::vector<int> claimed;
  for (size_t i = 0; i < pages_.size(); ++i) {
    if (pages_[i] != Pages::kFresh) continue;
    pages_[i] = Pages::kFaulting;
    claimed.push_back(static_cast<int>(i));
  }
  lock.unlock();
  for (size_t a = 0; a < claimed.size();) {
    size_t b = a + 1;
    while (b < claimed.size() && claimed[b] == claimed[b - 1] + 1) ++b;
    detail::populate_in_parallel(buffers_[claimed[a]], (b - a) * buffer_bytes_);
    a = b;
  }
  lock.lock();
  for (int i : claimed) pages_[i] = Pages::kReady;
  faulted_cv_.notify_all();
  // Buffers another thread was faulting meanwhile are its to finish.
  for (size_t i = 0; i < pages_.size(); ++i) {
    while (pages_[i] == Pages::kFaulting) faulted_cv_.wait(lock);
  }
}

void StagingPool::fault_in_background(bool background_priority, std::function<void()> done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (faulter_.joinable() || stop_) return;
  try {
    faulter_ = std::thread([this, background_priority, done = std::move(done)] {
      detail::name_this_thread("tsnap-fault");
      if (background_priority) io::make_background_thread();
      // Buffers are handed out from the back of free_: fault in from its front, so that the
      // saves' acquire() calls and this thread meet in the middle.
      std::unique_lock<std::mutex> lock(mu_);
      const std::vector<int> order(free_.begin(), free_.end());
      for (int index : order) {
        if (stop_) return;
        if (pages_[index] == Pages::kFresh) fault_in(index, lock);
      }
      for (size_t i = 0; i < pages_.size(); ++i) {  // and any a save's first use still faults
        if (stop_) return;
        fault_in(static_cast<int>(i), lock);
      }
      lock.unlock();
      collapse_free_buffers();
      {
        std::lock_guard<std::mutex> guard(mu_);
        if (stop_) return;
      }
      if (done) done();
    });
  } catch (const std::system_error&) {
    // No thread: each buffer is faulted in by its first acquire(), and `done` does not run.
  }
}

void StagingPool::collapse_free_buffers() {
  if (memory_ == nullptr || memory_->size() <= kSmallPool) return;  // huge pages already
  constexpr uint64_t kHuge = 2ull << 20;
  constexpr std::chrono::milliseconds kRetry{50};
  std::vector<bool> done(buffers_.size(), false);
  size_t left = buffers_.size();
  int idle = 0;  // retries in a row that found no buffer to collapse: 20 (1 s) and it gives up
  std::unique_lock<std::mutex> lock(mu_);
  while (left > 0 && !stop_ && idle < 20) {
    if (staging_.load() > 0) {  // a save is copying: not now, and not a retry that counts
      faulted_cv_.wait_for(lock, kRetry);
      continue;
    }
    // A free buffer not collapsed yet, from the front of free_ (acquire() takes the back).
    auto it = std::find_if(free_.begin(), free_.end(), [&](int i) { return !done[i]; });
    if (it == free_.end() || waiters_.load() > 0) {
      faulted_cv_.wait_for(lock, kRetry);  // buffers come back when their writes finish
      ++idle;
      continue;
    }
    idle = 0;
    const int index = *it;
    free_.erase(it);
    ++collapsing_;
    lock.unlock();
    // A 2 MiB step at a time, and given back at once when a save waits for a buffer.
    bool all = true;
    for (uint64_t at = 0; at < buffer_bytes_; at += kHuge) {
      if (waiters_.load() > 0 || staging_.load() > 0) {
        all = false;
        break;
      }
      (void)detail::collapse_into_huge_pages(buffers_[index] + at,
                                             std::min(kHuge, buffer_bytes_ - at));
    }
    lock.lock();
    --collapsing_;
    free_.insert(free_.begin(), index);
    cv_.notify_one();
    if (all) {
      done[index] = true;
      --left;
    }
  }
}

void StagingPool::stop_background() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    faulted_cv_.notify_all();
  }
  if (faulter_.joinable() && faulter_.get_id() != std::this_thread::get_id()) faulter_.join();
}

int StagingPool::acquire(bool* waited) {
  std::unique_lock<std::mutex> lock(mu_);
  if (waited != nullptr) *waited = free_.empty();
  struct Waiting {  // counted while this waits, so that a collapse gives its buffer back
    std::atomic<int>& n;
    bool counted = false;
    ~Waiting() {
      if (counted) --n;
    }
  } waiting{waiters_};
  while (free_.empty()) {
    if (!waiting.counted) {
      ++waiters_;
      waiting.counted = true;
    }
    if (!reclaim_) {
      cv_.wait(lock);
      continue;
    }
    // Kept buffers (hot images) come back only if reclaimed; and an image may start keeping
    // buffers while this waits, so the reclaim is tried again until a buffer is free.
    const std::function<void()> reclaim = reclaim_;
    lock.unlock();
    reclaim();
    lock.lock();
    if (free_.empty()) cv_.wait_for(lock, kReclaimRetry);
  }
  // Not the buffer the background thread is faulting in, if another is free: that thread
  // runs at a low priority, and a save must not wait for it behind a busy training loop.
  for (size_t k = free_.size(); k-- > 0;) {
    if (pages_[free_[k]] != Pages::kFaulting) {
      std::swap(free_[k], free_.back());
      break;
    }
  }
  const int i = free_.back();
  free_.pop_back();
  fault_in(i, lock);
  return i;
}

void StagingPool::take(int index) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = std::find(free_.begin(), free_.end(), index);
  if (it == free_.end()) {
    throw_error(ErrorCode::kInvalidArgument,
                "staging buffer " + std::to_string(index) + " is not free");
  }
  free_.erase(it);
  used_[index] = true;
  fault_in(index, lock);
}

void StagingPool::release(int index) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    used_[index] = true;
    free_.push_back(index);
  }
  cv_.notify_one();
}

void StagingPool::set_reclaim(std::function<void()> reclaim) {
  std::lock_guard<std::mutex> lock(mu_);
  reclaim_ = std::move(reclaim);
}

bool StagingPool::used_before(int index) const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_[index];
}

size_t StagingPool::in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return buffers_.size() - free_.size() - collapsing_;
}

}  // namespace tsnap::stage
