#include "common/run_parallel.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace tsnap::detail {

void run_parallel(size_t tasks, int threads, const std::function<void(size_t, int)>& work) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mu;
  auto run = [&](int worker) {
    try {
      for (size_t i; !failed && (i = next++) < tasks;) work(i, worker);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu);
      if (!error) error = std::current_exception();
      failed = true;
    }
  };
  const int n =
      static_cast<int>(std::min<size_t>(std::max(1, threads), std::max<size_t>(1, tasks)));
  std::vector<std::thread> pool;
  for (int w = 1; w < n; ++w) {
    try {
      pool.emplace_back(run, w);
    } catch (const std::system_error&) {
      break;  // the started ones, and the caller, take every task
    }
  }
  run(0);
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace tsnap::detail
