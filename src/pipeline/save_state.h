#pragma once
// The shared state behind a SaveHandle: completion flags, the first error, callbacks, stats.

#include <condition_variable>
#include <exception>
#include <filesystem>
#include <functional>
#include <mutex>
#include <vector>

#include "common/owner_process.h"
#include "tsnap/save_handle.h"

namespace tsnap::detail {

struct SaveState {
  std::mutex mu;
  std::condition_variable cv;
  bool staged = false;
  bool done = false;
  std::exception_ptr stage_error;
  std::exception_ptr error;
  std::vector<std::function<void(std::exception_ptr)>> callbacks;
  SaveStats stats;
  std::filesystem::path path;
  OwnerProcess owner;  // a forked child cannot wait for it: its threads are not there

  /// Staging finished (with `e` on failure): wakes wait_staged().
  void mark_staged(std::exception_ptr e);
  /// The save finished: records `e`, runs callbacks on this thread, wakes waiters. Once only.
  void complete(std::exception_ptr e);
};

}  // namespace tsnap::detail
