#pragma once
// Running independent tasks on a few threads of their own, for work that blocks on the network
// or the disk rather than the CPU (object-storage transfers), where TBB's arena would idle
// cores while a request waits.
//
// Thread-safety: `work` runs on up to `threads` threads at once (the caller's among them).

#include <cstddef>
#include <functional>

namespace tsnap::detail {

/// Calls work(task, worker) for every task in [0, tasks) on min(threads, tasks) threads; the
/// caller's thread is worker 0, so `worker` (< threads) can index per-thread buffers. After a
/// task throws, no new task starts; once every thread has stopped, the first exception is
/// rethrown. A thread that cannot be started leaves its share to the others.
void run_parallel(size_t tasks, int threads, const std::function<void(size_t, int)>& work);

}  // namespace tsnap::detail
