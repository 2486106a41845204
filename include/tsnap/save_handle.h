#pragma once
/// \file
/// `tsnap::SaveHandle`: the future of one asynchronous save, and its statistics.

#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "tsnap/export.h"

namespace tsnap {

namespace detail {
struct SaveState;
}

/// Figures of one save; times in seconds.
struct TSNAP_API SaveStats {
  double stall_s = 0;   ///< How long save_async blocked the caller.
  double stage_s = 0;   ///< Copy + convert + hash into staging buffers (wall time).
  double write_s = 0;   ///< From the first write submitted to the last completed.
  double commit_s = 0;  ///< fsync, manifest, rename.
  double total_s = 0;   ///< From the call to committed.
  /// Distributed saves: time spent waiting for the other ranks' parts (rank 0) or for rank 0's
  /// verdict, which includes its commit (other ranks); part of commit_s.
  double coordinate_s = 0;
  uint64_t bytes = 0;  ///< Bytes of the snapshot (all shard files plus manifest).
  /// Bytes this save put on disk: `bytes` less the files an incremental save hard-linked from
  /// the previous snapshot (SaveOptions::incremental); equal to `bytes` otherwise.
  uint64_t written_bytes = 0;
  uint64_t linked_bytes = 0;  ///< Bytes of the files hard-linked from the previous snapshot.
  /// Incremental saves: bytes of the chunks found equal to the previous snapshot's, which were
  /// not written from the staging buffers (linked, or copied by the kernel).
  uint64_t reused_bytes = 0;
  uint64_t tensor_bytes = 0;  ///< Stored tensor bytes.
  uint64_t chunks = 0;
  uint64_t files = 0;
  uint64_t tensors = 0;
  uint64_t buffer_waits = 0;    ///< Times staging waited for a buffer (snapshot > budget).
  uint64_t buffers_reused = 0;  ///< Staging buffers that earlier saves had already used.
  std::string engine;           ///< "io_uring" or "pwrite".
  bool direct = false;          ///< Whether O_DIRECT was used.
  /// With overwrite: the hidden temporary path of the replaced snapshot when it could not be
  /// removed (e.g. permissions); the save still committed, and the next writer that starts
  /// alone on the root removes it. Empty otherwise.
  std::string leftover;
  /// The previous snapshot this Snapshotter committed, which this save was compared with;
  /// empty at its first save.
  std::string unchanged_since;
  /// Tensors whose stored bytes are identical to their bytes in `unchanged_since` (compared by
  /// hashes of each tensor's bytes; recorded in the manifest's `unchanged`).
  uint64_t unchanged_tensors = 0;
  /// Keys of SaveOptions::stale.must_change that did not change although the step advanced:
  /// the snapshot may hold stale state (see StaleCheck). Empty when none or not checked.
  std::vector<std::string> stale;
  /// bytes / total_s in GB/s (1e9 bytes), 0 before completion.
  double throughput_gbps() const { return total_s > 0 ? bytes / total_s / 1e9 : 0; }
};

/// SaveStats as a JSON object with the fields' names (`nlohmann::json j = stats;`), plus
/// "throughput_gbps": one structured record per save for a training logger.
TSNAP_API void to_json(nlohmann::json& out, const SaveStats& stats);

/// The handle of a save in flight. Copyable (shared state); all methods are thread-safe.
/// Dropping every copy does not cancel the save: the Snapshotter finishes it.
///
/// Ordering: a save gives back everything a next save could need (its `max_in_flight` slot, its
/// name, and its staging buffers) *before* its handle completes. So once `wait()` returns, `done()`
/// is true, or an `on_complete` callback runs, `Snapshotter::save_async` admits a new save at once:
/// `InFlightPolicy::kFailFast` does not refuse it and `kWait` does not block on this save.
class TSNAP_API SaveHandle {
 public:
  SaveHandle() = default;
  explicit SaveHandle(std::shared_ptr<detail::SaveState> state) : state_(std::move(state)) {}

  /// Blocks until the snapshot is committed; rethrows the save's error, if any.
  void wait() const;
  /// Waits at most `timeout`; true when done (then `wait()` returns or throws at once).
  bool wait_for(std::chrono::milliseconds timeout) const;
  /// True once committed or failed.
  bool done() const;
  /// Blocks until every tensor is staged (the caller may change its tensors); rethrows a staging
  /// error. Returns at once for eager saves.
  void wait_staged() const;
  /// Runs `fn(error)` once the save completes (error is null on success), on the tsnap thread
  /// that completed it,
  /// or at once on this thread if it has already completed. `fn` must not throw or block long.
  void on_complete(std::function<void(std::exception_ptr)> fn) const;
  /// Figures so far; complete once `done()`.
  SaveStats stats() const;
  /// The final snapshot directory.
  std::filesystem::path path() const;
  /// The save's error once failed, else null.
  std::exception_ptr error() const;
  bool valid() const { return state_ != nullptr; }

 private:
  std::shared_ptr<detail::SaveState> state_;
};

}  // namespace tsnap
