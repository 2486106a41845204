#include "io/thread_priority.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <cerrno>
#include <condition_variable>
#include <mutex>

#include "common/thread_name.h"

namespace tsnap::io {
namespace {

// linux/ioprio.h, which older headers lack.
constexpr int kIoprioWhoProcess = 1;
constexpr int kIoprioClassBe = 2;
constexpr int kIoprioClassShift = 13;
constexpr int kLowestBeLevel = 7;

}  // namespace

void make_background_thread() {
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  errno = 0;
  const int nice = ::getpriority(PRIO_PROCESS, tid);
  if (errno == 0) {
    (void)::setpriority(PRIO_PROCESS, tid, std::min(19, nice + kBackgroundNice));
  }
#ifdef SYS_ioprio_set
  (void)::syscall(SYS_ioprio_set, kIoprioWhoProcess, static_cast<int>(tid),
                  (kIoprioClassBe << kIoprioClassShift) | kLowestBeLevel);
#endif
}

void set_up_pool(boost::asio::thread_pool& pool, size_t threads, const char* name,
                 bool background) {
  // Each task holds its thread until all have started, so that each thread runs exactly one.
  std::mutex mu;
  std::condition_variable cv;
  size_t started = 0, done = 0;
  for (size_t i = 0; i < threads; ++i) {
    boost::asio::post(pool, [&] {
      detail::name_this_thread(name);
      if (background) make_background_thread();
      std::unique_lock<std::mutex> lock(mu);
      ++started;
      cv.notify_all();
      cv.wait(lock, [&] { return started == threads; });
      ++done;
      cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done == threads; });
}

}  // namespace tsnap::io
