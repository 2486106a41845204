#pragma once
/// \file
/// The drain of a two-tier Snapshotter (SnapshotterOptions::tier.durable_root): one background
/// thread that copies committed snapshots from the fast local root to the durable root.
///
/// One drain of snapshot `<local>/<name>` writes it into the durable root through that root's
/// write side (pipeline/durable_store.h: a directory, or object storage), one copy path for
/// both: open the local snapshot once and read its manifest's exact bytes; nothing to do when
/// the durable root holds that save already (same id) or a newer one; else write each file,
/// every chunk checked against the manifest's XXH3-64 before any of it leaves (a mismatch fails
/// the drain, naming file and chunk), paced to the rate limit; publish the manifest last.
/// A failure or a kill at any point leaves the durable root as a failed save leaves a root:
/// earlier snapshots intact, nothing listed that is not complete.

/// Passes: each request (a local commit, drain_wait, the start) runs a pass over the committed
/// local snapshots, oldest first, and drains those whose save is not known to be durable.
/// "Known durable" is a set of (name, id) filled at the start from the durable root and by
/// every successful drain; it is not emptied when durable retention deletes a snapshot, so
/// a snapshot retention removed is not copied again (until the process restarts: then one that
/// is still local and missing durably is copied once more, and retention removes it again).
/// A failure caused by the local bytes (FormatError: corrupt chunk, truncated file, bad
/// manifest) is not retried for that save; any other failure (I/O on the durable side) stops
/// the pass and is retried by the next one.
///
/// Node-local roots (DrainConfig::node_rank >= 0, TierOptions::node_local): every rank of the
/// group runs a drain, and a node's copy of a snapshot holds the full manifest but only the
/// files of that node's ranks. A rank drains its share: each file of the manifest its node
/// holds (its own first), claimed by a `flock` on the local file so that the node's ranks
/// split them, skipped when already in place in the durable root, copied chunk-checked as
/// above, into a save shared by the group's ranks (DurableStore::begin). Then it looks whether
/// every file of the save is in place; the rank that finds so publishes the manifest (the last
/// to complete a file always does; two at once publish the same bytes). What "in place" is on
/// each root is in dir_store.h and s3_store.h. No rank waits for another: a rank that dies
/// leaves the save unpublished, and any later drain that holds the missing files (a restart, on
/// any world size) completes and publishes it.
///
/// Hard links: a directory root links a shard that an incremental save reused whole from an
/// earlier snapshot (FileRecord::reused_from) from the durable copy of that snapshot when it
/// holds the same file (dir_store.cpp), so a chain of incremental snapshots shares storage in
/// the durable tier as in the local one.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "format/open_file.h"
#include "io/engine.h"
#include "pipeline/durable_store.h"
#include "tsnap/manifest.h"
#include "tsnap/snapshotter.h"

namespace tsnap::pipeline {

/// What a Drain needs from its Snapshotter.
struct DrainConfig {
  std::filesystem::path local_root;
  std::filesystem::path durable_root;
  uint64_t bytes_per_second = 0;  ///< 0: unlimited.
  int local_keep_last = 2;        ///< 0: keep every local snapshot.
  bool background = true;         ///< Lower the thread's CPU and I/O priority.
  /// True while a save of `name` is in flight on the local root (local_keep_last skips it).
  /// Called on the drain thread without any drain lock held.
  std::function<bool(const std::string&)> busy;
  /// The engine for a directory durable root (writes, fsyncs, renames); null: a pwrite engine.
  std::shared_ptr<io::Engine> engine;
  /// Node-local roots (TierOptions::node_local): this rank's number in its group, or -1 when
  /// the local root is one this drain owns alone. See "Node-local roots" above.
  int node_rank = -1;
};

/// The drain thread; see the file comment.
/// Thread-safety: every method may be called from any thread. Ownership: owns its thread and
/// the durable root's store (its engine, and a directory's lock). Destruction stops a copy in
/// progress (its temporary directory is removed) and joins the thread.
class Drain {
 public:
  /// Opens the durable root's store (a directory is created and locked, removing stale
  /// temporaries when alone), reads which saves it holds, starts the thread and requests a
  /// first pass. Errors: IoError when a durable directory cannot be created, opened or
  /// listed. A remote store (object storage): only the URL is checked here (InvalidArgument);
  /// the first pass asks the store, and a failure there is a failed drain (retried by the
  /// next pass).
  explicit Drain(DrainConfig config);
  ~Drain();
  Drain(const Drain&) = delete;
  Drain& operator=(const Drain&) = delete;

  /// Asks for a pass (after a local commit). Never blocks for long, never throws.
  void request() noexcept;
  /// Requests a pass and waits for it; throws the first unreported failure (see
  /// Snapshotter::drain_wait).
  void wait();
  /// See Snapshotter::drained.
  bool drained(const std::string& name) const;
  DrainStats stats() const;
  int add_listener(std::function<void(const DrainRecord&)> fn);
  void remove_listener(int id);

 private:
  using Save = std::pair<std::string, std::string>;  // (name, id)
  struct Cancelled {};                               // the Drain is being destroyed
  struct Abandoned {};  // the local snapshot was replaced or removed while being copied

  void run();
  void pass();
  // Reads which saves the durable root holds (a remote store: on the drain thread).
  void open_store();
  // Copies one snapshot; returns its record, or nullopt when nothing was copied (durable
  // already, superseded, abandoned, or a share written that another rank publishes).
  std::optional<DrainRecord> drain_one(const std::filesystem::path& local, const std::string& name);
  // Node-local roots: calls `copy` for each file of `m` that this node holds, is not
  // `in_place`, is not locked by another rank of the node (flock on the local file, held
  // during the copy) and is still `missing` once locked; this rank's own files first.
  void copy_share(const format::SnapshotDir& dir, const Manifest& m,
                  const std::set<std::string>& in_place,
                  const std::function<bool(const FileRecord&)>& missing,
                  const std::function<void(const FileRecord&, const format::OpenedFile&,
                                           const std::string&)>& copy);
  // A share copied but not published: its bytes are counted; nothing to report.
  std::optional<DrainRecord> share_done(const DrainRecord& record);
  // Opens shard `f` of the local snapshot (Abandoned when the snapshot was replaced).
  format::OpenedFile open_source(const format::SnapshotDir& dir, const FileRecord& f) const;
  void keep_last(DrainRecord& record);
  void pace(uint64_t bytes);
  void notify(const DrainRecord& record);

  const DrainConfig config_;
  std::unique_ptr<DurableStore> store_;
  bool store_open_ = false;  // open_store() done

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> stop_{false};
  uint64_t requested_ = 0;  // pass requests so far
  uint64_t finished_ = 0;   // the requests the last finished pass served
  std::set<Save> durable_;  // saves known durable (see the file comment)
  std::set<Save> failed_;   // saves whose local bytes are bad: not retried
  std::map<std::string, std::exception_ptr> unreported_;  // by name, until drained or thrown
  std::map<std::string, uint64_t> failure_order_;         // name -> sequence of its failure
  uint64_t failures_ = 0;
  DrainStats stats_;

  std::mutex listeners_mu_;  // held while listeners run
  std::map<int, std::function<void(const DrainRecord&)>> listeners_;
  int next_listener_ = 0;

  std::chrono::steady_clock::time_point next_write_{};  // pacing (guarded by mu_)
  std::thread thread_;
};

}  // namespace tsnap::pipeline
