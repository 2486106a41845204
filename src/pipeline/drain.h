#pragma once
/// \file
/// The drain of a two-tier Snapshotter (SnapshotterOptions::tier.durable_root): one background
/// thread that copies committed snapshots from the fast local root to the durable root.
///
/// One drain of snapshot `<local>/<name>` (drain.cpp spells out each step):
///   1. open the local snapshot directory once and read its MANIFEST.json (the exact bytes);
///   2. skip it when the durable tier holds the same save already (same id), or a newer one;
///   3. create `<durable>/.<name>.tmp-<id>` (a fresh id) and copy each shard file chunk by
///      chunk: read the chunk, check its XXH3-64 against the manifest BEFORE writing any of it
///      (a mismatch fails the drain, naming file and chunk), write it paced to the rate limit,
///      fsync the file;
///   4. commit with pipeline::commit_directory: MANIFEST.json (the local bytes) last, fsync,
///      rename to `<durable>/<name>` (an existing durable snapshot of that name is exchanged
///      atomically, then removed), fsync the durable root.
/// A failure or a kill at any point leaves the durable root as a failed save leaves a root:
/// earlier snapshots intact, at most a temporary directory (removed on failure here, or by the
/// next writer alone on the durable root: the drain holds a RootLock on it).
///
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
/// Object storage (a durable root "s3://bucket/prefix", format/s3_root.h): step 3 uploads
/// each shard as `<prefix>/<name>/<file>` (one PUT when it fits in a part, else a multipart
/// upload of parts of whole chunks, kUploadThreads at once, each chunk checked before its part
/// leaves), step 4 deletes an older save's manifest of that name first, then PUTs the manifest
/// last and deletes that older save's other objects. Uploads an interrupted drain left are
/// listed at the start and resumed (a part is kept when its size and MD5 match the local
/// bytes); stale ones of the same key are aborted. Hard links do not apply there.
///
/// Node-local roots (DrainConfig::node_rank >= 0, TierOptions::node_local): every rank of the
/// group runs a drain, and a node's copy of a snapshot holds the full manifest but only the
/// files of that node's ranks. A rank drains its share: each file of the manifest its node
/// holds (its own first), claimed by a `flock` on the local file so that the node's ranks
/// split them, skipped when already in place in the durable root, copied chunk-checked as
/// above. Then it looks whether every file of the save is in place; the rank that finds so
/// publishes the manifest (the last to complete a file always does; two at once publish the
/// same bytes). "In place": object storage, a mark object written after the file's upload
/// (`<name>/.uploaded-<id>/<file>`, removed with the older objects after the publication); a
/// directory, the file renamed into `<durable>/.<name>.tmp-<id>.share/` (one temporary
/// directory per save, shared by the ranks, and not one that a writer starting alone removes
/// as stale) from a part file, and the commit made under that directory's flock. No rank waits for
/// another: a rank that dies leaves the save unpublished, and any later drain that holds the
/// missing files (a restart, on any world size) completes and publishes it.
///
/// Hard links: a shard that an incremental save reused whole from an earlier snapshot
/// (FileRecord::reused_from) is hard-linked from the durable tier's copy of that snapshot when
/// it holds the same file (same size, header id and chunk hashes), else copied as bytes; so a
/// chain of incremental snapshots shares storage in the durable tier as in the local one.

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
#include "format/s3_root.h"
#include "io/engine.h"
#include "pipeline/root_lock.h"
#include "tsnap/manifest.h"
#include "tsnap/snapshotter.h"

namespace tsnap::pipeline {

/// Parts of one shard uploaded to object storage at once.
inline constexpr int kUploadThreads = 4;
/// Node-local roots on object storage: the marks of a save's uploaded files are the objects
/// `<prefix>/<name>/.uploaded-<id>/<file>`.
inline constexpr const char* kUploadedPrefix = ".uploaded-";
/// Node-local roots on a directory: the ranks' shared temporary directory of a save is
/// `<durable>/.<name>.tmp-<id>.share`.
inline constexpr const char* kShareSuffix = ".share";

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
  /// The engine for the durable side (writes, fsyncs, renames); null: a pwrite engine.
  std::shared_ptr<io::Engine> engine;
  /// Node-local roots (TierOptions::node_local): this rank's number in its group, or -1 when
  /// the local root is one this drain owns alone. See "Node-local roots" above.
  int node_rank = -1;
};

/// The drain thread; see the file comment.
/// Thread-safety: every method may be called from any thread. Ownership: owns its thread, its
/// engine and the lock of the durable root. Destruction stops a copy in progress (its
/// temporary directory is removed) and joins the thread.
class Drain {
 public:
  /// Creates the durable root, locks it (removing stale temporaries when alone), reads which
  /// saves it holds, starts the thread and requests a first pass. Errors: IoError when the
  /// durable root cannot be created, opened or listed. Object storage: only the URL is checked
  /// here (InvalidArgument); the first pass asks the store, and a failure there is a failed
  /// drain (retried by the next pass).
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
  // Object storage: reads which saves the store holds and which uploads it can resume.
  void open_store();
  // Copies one snapshot; returns its record, or nullopt when nothing was copied (durable
  // already, superseded, abandoned).
  std::optional<DrainRecord> drain_one(const std::filesystem::path& local, const std::string& name);
  // Links `f` into `temporary` from the durable tier's copy of the snapshot it was reused from,
  // when that copy holds the same file; `bases` caches the durable manifests read.
  bool link_reused(const FileRecord& f, const Manifest& m, const std::string& temporary,
                   std::map<std::string, std::optional<Manifest>>& bases) const;
  // Steps 2-4 for object storage.
  std::optional<DrainRecord> drain_one_s3(const format::SnapshotDir& dir, const std::string& text,
                                          const Manifest& m, const std::string& name);
  // Step 2: true when the durable root holds save `m` of `name` already, or a newer one (then
  // it is known durable). Object storage: otherwise deletes the manifest of an older save.
  bool settled_dir(const std::string& name, const Manifest& m);
  bool settled_s3(const std::string& name, const Manifest& m);
  // Step 4 for object storage: the manifest, then the older save's leftovers.
  void publish_s3(const std::string& name, const std::string& text, const Manifest& m,
                  DrainRecord& record);
  // Node-local roots: this rank's share of a save, and the publication by whichever rank
  // finds every file in place (see "Node-local roots" above).
  std::optional<DrainRecord> drain_share_s3(const format::SnapshotDir& dir, const std::string& text,
                                            const Manifest& m, const std::string& name);
  std::optional<DrainRecord> drain_share_dir(const format::SnapshotDir& dir,
                                             const std::string& text, const Manifest& m,
                                             const std::string& name);
  // Calls `copy` for each file of `m` that this node holds, is not `in_place`, is not locked
  // by another rank of the node (flock on the local file, held during the copy) and is still
  // `missing` once locked; this rank's own files first.
  void copy_share(const format::SnapshotDir& dir, const Manifest& m,
                  const std::set<std::string>& in_place,
                  const std::function<bool(const FileRecord&)>& missing,
                  const std::function<void(const FileRecord&, const format::OpenedFile&,
                                           const std::string&)>& copy);
  // A share copied but not published: its bytes are counted; nothing to report.
  std::optional<DrainRecord> share_done(const DrainRecord& record);
  // Opens shard `f` of the local snapshot (Abandoned when the snapshot was replaced).
  format::OpenedFile open_source(const format::SnapshotDir& dir, const FileRecord& f) const;
  // Copies shard `f` from `src` into the new file `to`, each chunk checked before it is written.
  void copy_file(const format::OpenedFile& src, const std::string& label, const FileRecord& f,
                 const std::string& to, DrainRecord& record);
  // Uploads shard `f` from `src` as `key`, each chunk checked before it leaves.
  void upload_file(const format::OpenedFile& src, const std::string& label, const FileRecord& f,
                   const std::string& key, DrainRecord& record);
  void keep_last(DrainRecord& record);
  void pace(uint64_t bytes);
  void notify(const DrainRecord& record);

  const DrainConfig config_;
  std::shared_ptr<io::Engine> engine_;
  std::optional<RootLock> lock_;
  std::optional<format::S3Root> s3_;              // an object-storage durable root
  std::map<std::string, std::string> resumable_;  // S3 key -> an interrupted upload's id
  bool store_open_ = false;                       // open_store() done (drain thread)

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
