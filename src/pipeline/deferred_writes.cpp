#include "pipeline/deferred_writes.h"

#include <utility>

namespace tsnap::pipeline {

uint64_t DeferredWrites::begin() {
  std::lock_guard<std::mutex> lock(mu_);
  if (active_ != 0) return 0;
  active_ = ++last_;
  return active_;
}

bool DeferredWrites::hold(uint64_t ticket, std::function<void()> write) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ticket == 0 || ticket != active_) return false;
  writes_.push_back(std::move(write));
  return true;
}

void DeferredWrites::release(uint64_t ticket) {
  if (ticket != 0) release_matching(ticket);
}

void DeferredWrites::release_any() { release_matching(0); }

void DeferredWrites::release_matching(uint64_t ticket) {
  std::vector<std::function<void()>> writes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (active_ == 0 || (ticket != 0 && ticket != active_)) return;
    active_ = 0;
    writes.swap(writes_);
  }
  for (const std::function<void()>& write : writes) write();
}

}  // namespace tsnap::pipeline
