#pragma once
// Counts a save's or load's bytes and reports them to the user's ProgressFn, one call at a time.

#include <cstdint>
#include <mutex>

#include "tsnap/progress.h"

namespace tsnap::detail {

/// Thread-safe; does nothing without a callback.
class ProgressMeter {
 public:
  ProgressMeter() = default;
  ProgressMeter(ProgressFn fn, uint64_t total_bytes) : fn_(std::move(fn)) {
    progress_.total_bytes = total_bytes;
  }
  /// A save's chunk is staged.
  void staged(uint64_t bytes) { add(bytes, 0); }
  /// A save's chunk is written, or a load's chunk read and verified (then it counts as staged
  /// too).
  void done(uint64_t bytes, bool also_staged = false) { add(also_staged ? bytes : 0, bytes); }

 private:
  void add(uint64_t staged, uint64_t done);

  ProgressFn fn_;
  std::mutex mu_;
  Progress progress_;
};

}  // namespace tsnap::detail
