#pragma once
// Background priority for the threads a Snapshotter runs beside training (the io thread that
// writes and hashes chunks, the pwrite pool, the pool that commits and stages lazily): a lower
// CPU priority (nice) and I/O priority (best-effort class, lowest level), so that when they
// compete with a training loop's threads for the cores or the disk, training wins, and
// snapshots take the idle time. SnapshotterOptions::background_priority turns it on.
//
// Linux only; advisory: a kernel or sandbox that refuses leaves the thread as it was. Lowering
// is for the thread's life (raising it back needs privileges), so it is only applied to
// threads that tsnap owns. set_up_pool also names a pool's threads (common/thread_name.h).

#include <cstddef>

namespace boost::asio {
class thread_pool;
}

namespace tsnap::io {

/// Niceness added to a background thread's (capped at 19).
inline constexpr int kBackgroundNice = 10;

/// Lowers the calling thread's CPU priority by kBackgroundNice and sets its I/O priority to
/// best-effort level 7 (the lowest of that class; I/O of the idle class could starve).
void make_background_thread();

/// Names each of `pool`'s `threads` threads `name` (common/thread_name.h) and, when
/// `background`, runs make_background_thread on it (blocks until every thread has; the pool must
/// have exactly that many threads and nothing else queued that waits).
void set_up_pool(boost::asio::thread_pool& pool, size_t threads, const char* name, bool background);

}  // namespace tsnap::io
