#pragma once
// What a Snapshotter owns and lends to each save: the engine host (engine and io thread), the
// staging pool, the TBB arena and a small pool for blocking work (lazy staging, commits).

#include <tbb/task_arena.h>
#include <tbb/task_scheduler_observer.h>

#include <atomic>
#include <boost/asio/thread_pool.hpp>
#include <memory>
#include <vector>

#include "io/engine_host.h"
#include "stage/staging_pool.h"
#include "tsnap/snapshotter.h"

namespace tsnap::pipeline {

struct Resources {
  SnapshotterOptions options;
  std::unique_ptr<io::EngineHost> host;  // host_for_save's choice
  std::unique_ptr<stage::StagingPool> pool;
  std::unique_ptr<tbb::task_arena> arena;       // eager staging (the caller waits for it)
  std::unique_ptr<tbb::task_arena> lazy_arena;  // lazy staging (overlaps the training)
  // Name the TBB workers that join the arenas tsnap-stage (common/thread_name.h); destroyed
  // before the arenas.
  std::vector<std::unique_ptr<tbb::task_scheduler_observer>> arena_namers;
  std::unique_ptr<boost::asio::thread_pool> blocking;
  // Set while a save stages with its writes held back (SaveJob::defer_writes_): one at a time,
  // so that two eager saves staged at once from two threads never both hold buffers unwritten
  // while each waits for the other's.
  std::atomic<bool> deferring{false};
};

}  // namespace tsnap::pipeline
