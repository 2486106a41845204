#include "common/test_point.h"

#include <atomic>

namespace tsnap::detail {
namespace {

std::atomic<TestPointCallback> callback_{nullptr};

}  // namespace

void set_test_point_callback(TestPointCallback callback) noexcept { callback_.store(callback); }

void test_point(const char* point) noexcept {
  if (const TestPointCallback cb = callback_.load(std::memory_order_relaxed)) cb(point);
}

}  // namespace tsnap::detail
