#pragma once
// What a Snapshotter owns and lends to each save: the engine, the staging pool, the TBB arena,
// the io thread's io_context and a small pool for blocking work (lazy staging, commits).

#include <tbb/task_arena.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <memory>
#include <optional>
#include <thread>

#include "io/engine.h"
#include "stage/staging_pool.h"
#include "tsnap/snapshotter.h"

namespace tsnap::pipeline {

struct Resources {
  SnapshotterOptions options;
  boost::asio::io_context io;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work;
  std::thread io_thread;
  std::shared_ptr<io::Engine> engine;
  bool direct = false;
  std::unique_ptr<stage::StagingPool> pool;
  std::unique_ptr<tbb::task_arena> arena;
  std::unique_ptr<boost::asio::thread_pool> blocking;
};

}  // namespace tsnap::pipeline
