// Background priority: a thread made a background thread runs at a higher niceness and the
// lowest best-effort I/O priority; each thread of a pool is named and made one exactly once.

#include "io/thread_priority.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <future>
#include <string>
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

std::string name_of_this_thread() {
  char name[16] = {};
  ::pthread_getname_np(::pthread_self(), name, sizeof name);
  return name;
}

TEST(ThreadPriority, EveryThreadOfAPoolIsNamedAndBecomesABackgroundThread) {
  const int base = of_this_thread().nice;
  const std::string caller = name_of_this_thread();
  boost::asio::thread_pool pool(3);
  set_up_pool(pool, 3, "tsnap-test-pool-long-name", /*background=*/true);
  for (int i = 0; i < 6; ++i) {
    std::promise<std::pair<int, std::string>> seen;
    boost::asio::post(pool, [&] {
      seen.set_value({of_this_thread().nice, name_of_this_thread()});
    });
    const auto [nice, name] = seen.get_future().get();
    EXPECT_EQ(nice, std::min(19, base + kBackgroundNice));
    EXPECT_EQ(name, "tsnap-test-pool");  // the kernel keeps 15 characters
  }
  pool.join();
  EXPECT_EQ(name_of_this_thread(), caller);
}

TEST(ThreadPriority, APoolNamedButNotInTheBackgroundKeepsItsPriority) {
  const int base = of_this_thread().nice;
  boost::asio::thread_pool pool(2);
  set_up_pool(pool, 2, "tsnap-io", /*background=*/false);
  std::promise<std::pair<int, std::string>> seen;
  boost::asio::post(pool, [&] { seen.set_value({of_this_thread().nice, name_of_this_thread()}); });
  const auto [nice, name] = seen.get_future().get();
  EXPECT_EQ(nice, base);
  EXPECT_EQ(name, "tsnap-io");
  pool.join();
}

}  // namespace
}  // namespace tsnap::io
