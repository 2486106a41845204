#pragma once
// What a Snapshotter owns and lends to each save: the engine host (engine and io thread), the
// staging pool, the TBB arena and a small pool for blocking work (lazy staging, commits).

#include <tbb/task_arena.h>
#include <tbb/task_scheduler_observer.h>

#include <boost/asio/thread_pool.hpp>
#include <memory>
#include <vector>

#include "io/engine_host.h"
#include "pipeline/deferred_writes.h"
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
  // The writes an eager save holds back while it stages (deferred_writes.h); released by any
  // wait for a staging buffer (the pool's reclaim hook).
  DeferredWrites deferred;
};

}  // namespace tsnap::pipeline
