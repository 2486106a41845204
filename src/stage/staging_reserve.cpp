#include "stage/staging_reserve.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "common/thread_name.h"
#include "io/thread_priority.h"
#include "stage/staging_pool.h"

namespace tsnap::stage {
namespace {

constexpr uint64_t kStep = 8ull << 20;  // how often the faulting thread looks at its stop flag

// The one reservation: its memory and the thread faulting it in.
struct Reservation {
  std::unique_ptr<detail::AnonMemory> memory;
  std::thread faulter;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> faulted{0};

  ~Reservation() { stop_faulting(); }

  void fault() {
    for (uint64_t at = 0; at < memory->size() && !stop; at += kStep) {
      detail::populate(memory->data() + at, std::min(kStep, memory->size() - at));
      faulted = std::min(at + kStep, memory->size());
    }
  }
  void stop_faulting() {
    stop = true;
    if (faulter.joinable()) faulter.join();
  }
};

std::mutex mu;
std::unique_ptr<Reservation>& current() {
  static std::unique_ptr<Reservation> r;  // joined at exit by its destructor
  return r;
}

}  // namespace

void reserve(uint64_t bytes, bool wait) {
  std::lock_guard<std::mutex> lock(mu);
  current().reset();  // the previous reservation goes first: both never hold memory at once
  if (bytes == 0) return;
  auto r = std::make_unique<Reservation>();
  r->memory = std::make_unique<detail::AnonMemory>(bytes, bytes <= StagingPool::kSmallPool,
                                                   "reserved staging memory");
  if (wait) {
    r->fault();
  } else {
    try {
      r->faulter = std::thread([p = r.get()] {
        detail::name_this_thread("tsnap-reserve");
        io::make_background_thread();
        p->fault();
      });
    } catch (const std::system_error&) {
      r->fault();  // no thread: fault it in here
    }
  }
  current() = std::move(r);
}

uint64_t reserved_bytes() {
  std::lock_guard<std::mutex> lock(mu);
  const std::unique_ptr<Reservation>& r = current();
  return r ? r->memory->size() : 0;
}

Reserved take(uint64_t bytes, const std::string& what) {
  std::unique_ptr<Reservation> r;
  {
    std::lock_guard<std::mutex> lock(mu);
    r = std::move(current());
  }
  if (!r) return {};
  r->stop_faulting();
  Reserved out;
  out.faulted = std::min<uint64_t>(r->faulted, bytes);
  out.memory = std::move(r->memory);
  out.memory->resize(bytes, what);
  return out;
}

}  // namespace tsnap::stage
