#include "stage/staging_pool.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/Allocator.h>

#include <cstring>

#include "tsnap/error.h"

namespace tsnap::stage {
StagingPool::StagingPool(size_t count, size_t buffer_bytes, bool pinned)
    : buffer_bytes_(buffer_bytes) {
  if (count == 0 || buffer_bytes == 0 || buffer_bytes % 4096 != 0) {
    throw_error(ErrorCode::kInvalidArgument,
                "staging pool needs at least one buffer of a multiple of 4096 bytes");
  }
  const size_t total = count * buffer_bytes;
  uint8_t* base = nullptr;
  if (pinned && at::hasCUDA()) {
    auto* dp =
        new at::DataPtr(at::detail::getCUDAHooks().getPinnedMemoryAllocator()->allocate(total));
    base = static_cast<uint8_t*>(dp->get());
    pinned_ctx_ = dp;
    pinned_ = true;
    // Pre-fault every page now, so that no save pays for page faults (slow on this VM).
    std::memset(base, 0, total);
  } else {
    // Huge pages where the kernel offers them (fewer TLB misses while staging), faulted in
    // in-kernel on every core at once (common/anon_memory.h): 0.2-0.7 s for 1.5 GB here,
    // against 1-3 s for the memset on one thread that this replaced.
    memory_ = std::make_unique<detail::AnonMemory>(total, /*huge=*/true, "staging pool");
    base = memory_->data();
    detail::populate_in_parallel(base, total);
  }
  for (size_t i = 0; i < count; ++i) {
    buffers_.push_back(base + i * buffer_bytes);
    free_.push_back(static_cast<int>(count - 1 - i));
  }
  used_.assign(count, false);
}

StagingPool::~StagingPool() {
  if (pinned_ctx_ != nullptr) delete static_cast<at::DataPtr*>(pinned_ctx_);
}

int StagingPool::acquire(bool* waited) {
  std::unique_lock<std::mutex> lock(mu_);
  if (waited != nullptr) *waited = free_.empty();
  while (free_.empty()) {
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
  const int i = free_.back();
  free_.pop_back();
  return i;
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
  return buffers_.size() - free_.size();
}

}  // namespace tsnap::stage
