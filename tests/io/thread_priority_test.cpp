// Background priority: a thread made a background thread runs at a higher niceness and the
// lowest best-effort I/O priority; each thread of a pool is made one exactly once.

#include "io/thread_priority.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <future>
#include <thread>

namespace tsnap::io {
namespace {

struct Priorities {
  int nice = 0;
  long ioprio = 0;
};

Priorities of_this_thread() {
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  Priorities p;
  p.nice = ::getpriority(PRIO_PROCESS, tid);
  p.ioprio = ::syscall(SYS_ioprio_get, 1 /* IOPRIO_WHO_PROCESS */, static_cast<int>(tid));
  return p;
}

TEST(ThreadPriority, ABackgroundThreadIsNicerAndLowestBestEffortIo) {
  Priorities before, after;
  std::thread t([&] {
    before = of_this_thread();
    make_background_thread();
    after = of_this_thread();
  });
  t.join();
  EXPECT_EQ(after.nice, std::min(19, before.nice + kBackgroundNice));
  if (after.ioprio < 0) GTEST_SKIP() << "ioprio_get is refused here";
  EXPECT_EQ(after.ioprio, (2 << 13) | 7);         // IOPRIO_CLASS_BE, level 7
  EXPECT_EQ(of_this_thread().nice, before.nice);  // the calling thread is left alone
}

TEST(ThreadPriority, EveryThreadOfAPoolBecomesABackgroundThread) {
  const int base = of_this_thread().nice;
  boost::asio::thread_pool pool(3);
  make_background_pool(pool, 3);
  for (int i = 0; i < 6; ++i) {
    std::promise<int> nice;
    boost::asio::post(pool, [&] { nice.set_value(of_this_thread().nice); });
    EXPECT_EQ(nice.get_future().get(), std::min(19, base + kBackgroundNice));
  }
  pool.join();
}

}  // namespace
}  // namespace tsnap::io
