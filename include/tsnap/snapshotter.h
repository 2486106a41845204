#pragma once
/// \file
/// `tsnap::Snapshotter`: owns the save pipeline (staging pool, TBB arena, io engine, io thread)
/// and takes asynchronous, atomically committed snapshots under one root directory.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tsnap/engine_kind.h"
#include "tsnap/export.h"
#include "tsnap/hot_snapshot.h"
#include "tsnap/save_handle.h"
#include "tsnap/save_options.h"
#include "tsnap/state_dict.h"

namespace tsnap {

class Checkpoint;
class DistGroup;

/// The staging buffers: where a save's bytes wait between the copy and the disk
/// (SnapshotterOptions::staging).
struct TSNAP_API StagingOptions {
  /// Total size of the staging buffers, allocated once and reused by every save. 0 (default):
  /// automatic, sized at the first save to hold that save whole (its chunks), so that it
  /// stalls training for the staging copy alone, but at most a quarter of the machine's
  /// physical memory and at least 2 chunks; fixed from then on. A later, larger save waits
  /// for buffers that writes give back (SaveStats::buffer_waits, and the periodic log line).
  uint64_t budget_bytes = 0;
  /// TBB arena size for copy/convert/hash. 0: every core for eager staging (the caller waits
  /// for it: the copy is the stall) and half of them (>= 1) for lazy staging (which overlaps
  /// the training).
  int threads = 0;
  /// Keep the last committed snapshot's staged bytes in the staging pool (a hot snapshot,
  /// tsnap/hot_snapshot.h), so that `hot_snapshot()` can roll back from memory without reading
  /// the disk. A save's buffers then stay with it until it commits, and its image replaces the
  /// previous one; a save that finds no free buffer evicts the hot image (and, if still
  /// starved, gives up keeping its own), so keeping never blocks a save for long. With the
  /// automatic budget the pool is sized for two snapshots (within the same cap), so the image
  /// survives the next save. With `group`, each rank's image holds everything that rank
  /// restores: its pieces and every replicated entry, including those other ranks write (staged
  /// too, so the stall copies the whole replicated state on every rank, and hashed for the
  /// image only); its `manifest()` is that rank's view (see HotSnapshot).
  bool keep_hot = false;
};

/// The write engine (SnapshotterOptions::io).
struct TSNAP_API IoOptions {
  /// Threads of the pwrite engine (and for fsyncs). Also the most shard files a save with an
  /// automatic count (SaveOptions::num_shards = 0) writes: one per ~1 GiB, at most `threads`.
  int threads = 4;
  unsigned queue_depth = 32;  ///< io_uring submission queue depth.
  EngineKind engine = EngineKind::kAuto;
  bool direct_io = true;  ///< Use O_DIRECT where allowed.
};

/// A second, slower tier that committed snapshots drain to (SnapshotterOptions::tier).
struct TSNAP_API TierOptions {
  /// The durable root (e.g. a network filesystem), empty for none. Saves commit to `root`
  /// (the fast local tier: the training's stall and durability point); a background drain then
  /// copies each committed snapshot to `<durable_root>/<name>` with the same commit protocol,
  /// checking every chunk's XXH3-64 before it writes it, so a durable snapshot is never one that
  /// verifies wrong. At construction the drain starts with the committed snapshots of `root`
  /// that the durable tier lacks (oldest first: a drain interrupted by a crash resumes), after
  /// removing stale temporaries of the durable root (as on `root`). With a group whose
  /// snapshots are one shared directory committed by rank 0, rank 0 alone drains them (every
  /// rank's files) and applies the local tier's retention; on the other ranks drain_wait(),
  /// drained() and drain_stats() have nothing to report. With node-local roots (`node_local`)
  /// every rank drains. See Snapshotter::drain_wait.
  ///
  /// Object storage: `durable_root = "s3://bucket/prefix"` (endpoint, region and credentials
  /// from AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID,
  /// AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN; never logged). Each shard becomes the object
  /// `<prefix>/<name>/<file>`, uploaded in parts of whole chunks (at least 8 MiB), several at
  /// once, each chunk checked against its hash before it leaves and each part sent with its
  /// MD5 (the store checks it; the drain checks the ETag it returns); the manifest goes last,
  /// so the store never lists a partial snapshot (format/s3_root.h), and replacing a name
  /// deletes its old manifest first. A drain killed mid-upload leaves its multipart uploads:
  /// the next drain resumes them, keeping each part whose size and MD5 match the local bytes.
  /// A store that is down or refuses the credentials fails the drain (drain_wait throws it)
  /// and the next pass retries; training never waits for it, and local snapshots are kept
  /// until drained. One drain per prefix at a time (the store has no lock).
  std::filesystem::path durable_root;
  /// The drain's copy rate in bytes per second (writes paced in pieces of 1 MiB), 0 = unlimited.
  uint64_t bytes_per_second = 0;
  /// After each drain, the local tier keeps the newest `local_keep_last` committed snapshots
  /// (format.md's age rule) and removes older ones, but only those already in the durable tier
  /// (an undrained snapshot is never removed) and none being saved. 0 keeps everything.
  /// Retention of the durable tier is the user's (PeriodicSnapshots' keep rules).
  int local_keep_last = 2;
  /// With SnapshotterOptions::group: `root` is a node-local disk (the same path on every node, a
  /// different disk on each), not one directory that every rank shares. Each rank writes its files
  /// there; rank 0 merges the manifest as always and every node commits its own copy of the
  /// snapshot under `root` (the full manifest, the files of that node's ranks). Every rank then
  /// drains the files its node holds (its node's ranks split them; each paced to
  /// `bytes_per_second`) into `durable_root`, where the snapshot becomes one: the rank that
  /// completes the last upload publishes the manifest, after every file of the save is in place, so
  /// a durable snapshot is complete or absent. A rank killed mid-drain leaves the snapshot
  /// unpublished; a later drain (after a restart, on any world size) uploads what is missing and
  /// publishes it. drain_wait() returns when this rank's share is uploaded: once every rank's has
  /// returned, the snapshot is durable. Retention (local_keep_last) runs on every node. `resume`
  /// (PeriodicSnapshots) agrees on one snapshot across ranks: the newest that each rank can
  /// load, from its node's copy when that holds every file, else from the durable root.
  /// Ignored without a group.
  bool node_local = false;
};

/// A Snapshotter's link to a snapshot agent (tsnap/agent.h), which makes every save that
/// save_async returned outlive the trainer. Off by default (an empty socket).
struct TSNAP_API AgentLinkOptions {
  /// The agent's Unix socket (`tsnap agent --socket PATH`); empty: no agent. With one, the
  /// staging pool is shared memory (never pinned), `staging.keep_hot` is on, saves are full
  /// (incremental is ignored), and the pool must hold a whole save: the automatic budget does.
  std::filesystem::path socket;
  /// When the agent cannot be reached at construction, or its link goes down: false (the
  /// default) fails the Snapshotter's construction and each later save (IoError naming the
  /// socket), so that no save runs without the guarantee it asked for; true saves in-process
  /// as without an agent, and says so once on standard error.
  bool fall_back = false;
};

// The deprecated members below warn where a program names them, not where the compiler
// synthesises the struct's copies and destructor (which name every member).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
/// Options of a Snapshotter; fixed for its lifetime. Grouped by concern: the staging buffers,
/// the write engine and the durable tier each have their own struct. In C++17:
/// `tsnap::SnapshotterOptions o; o.root = "ckpt"; o.staging.budget_bytes = 1ull << 30;`.
struct TSNAP_API SnapshotterOptions {
  std::filesystem::path root;          ///< Snapshots go to `<root>/<name>/`.
  uint64_t chunk_bytes = 16ull << 20;  ///< Default chunk size (multiple of 4096).
  StagingOptions staging;              ///< The staging buffers and threads, the hot snapshot.
  IoOptions io;                        ///< The write engine.
  int max_in_flight = 2;               ///< Saves that may be writing at once.
  InFlightPolicy in_flight = InFlightPolicy::kWait;
  /// Default of SaveOptions::incremental for this Snapshotter's saves.
  bool incremental = false;
  /// Run the threads that work beside training (the io thread, which writes and hashes the
  /// chunks; the pwrite pool; the pool that commits and runs lazy staging) at a lower CPU
  /// priority (nice +10) and I/O priority (best-effort, lowest level), so that a training
  /// loop's threads win the cores and the disk when they compete. Staging that the caller
  /// waits for (eager) runs at the caller's priority either way.
  bool background_priority = true;
  /// Set for a distributed save (see tsnap/dist_group.h): every rank of the group makes a
  /// Snapshotter on the same root (a shared filesystem) and calls save_async in the same order
  /// with the same name; each writes its pieces of sharded tensors (entries with a ShardSpec)
  /// and its share of the replicated ones (the rest, written once across ranks), and rank 0
  /// commits the one snapshot once every rank's files are durable. Every rank's handle then
  /// completes with the same outcome.
  std::shared_ptr<DistGroup> group;
  TierOptions tier;        ///< The durable tier (none by default).
  AgentLinkOptions agent;  ///< A snapshot agent (none by default).

  /// \name Deprecated names of tsnap 0.1, kept until 0.3 (CHANGELOG.md).
  /// Each applies when set to other than its default, and then wins over the grouped field it
  /// names. Designated initialisers list them after every other field, in this order.
  ///@{
  [[deprecated("use staging.budget_bytes")]] uint64_t staging_budget_bytes = 0;
  [[deprecated("use staging.threads")]] int stage_threads = 0;
  [[deprecated("use io.threads")]] int io_threads = 4;
  [[deprecated("use io.queue_depth")]] unsigned queue_depth = 32;
  [[deprecated("use io.engine")]] EngineKind engine = EngineKind::kAuto;
  [[deprecated("use io.direct_io")]] bool direct_io = true;
  [[deprecated("use tier.durable_root")]] std::filesystem::path durable_root{};
  [[deprecated("use tier.bytes_per_second")]] uint64_t drain_bytes_per_second = 0;
  [[deprecated("use tier.local_keep_last")]] int local_keep_last = 2;
  [[deprecated("use staging.keep_hot")]] bool keep_hot = false;
  ///@}
};
#pragma GCC diagnostic pop

/// The outcome of copying one snapshot to the durable tier. Value type.
struct TSNAP_API DrainRecord {
  std::string name;    ///< The snapshot's name (the same under both roots).
  std::string id;      ///< Its save id.
  bool ok = false;     ///< Committed in the durable tier.
  std::string error;   ///< The failure's message when !ok (names the file and chunk).
  uint64_t bytes = 0;  ///< Bytes copied (shard files and manifest).
  /// Bytes of the shard files an incremental save reused whole (FileRecord::reused_from) that
  /// the durable tier already held: hard-linked there too instead of copied.
  uint64_t linked_bytes = 0;
  /// Object storage: bytes of parts that an interrupted drain had uploaded and that this one
  /// kept (their size and MD5 matched the local bytes) instead of sending again.
  uint64_t resumed_bytes = 0;
  double seconds = 0;  ///< From the start of the copy to the durable commit.
  /// Local snapshots removed after it by `local_keep_last`.
  std::vector<std::string> deleted_local;
};

/// The drain's figures so far. Value type.
struct TSNAP_API DrainStats {
  int64_t drained = 0;     ///< Snapshots committed in the durable tier.
  int64_t failed = 0;      ///< Drains that failed (each also reported by drain_wait).
  uint64_t bytes = 0;      ///< Bytes copied by successful drains.
  double seconds = 0;      ///< Time spent by successful drains.
  std::string last_error;  ///< The latest failure's message, empty if none.
};

/// Takes snapshots under `options.root` (and drains them to `options.tier.durable_root`).
/// Thread-safety: all methods may be called from any thread. Ownership: owns its buffers and
/// threads. Destruction waits for every save in flight to commit or fail (never leaves a
/// committed-looking partial snapshot); callers that want to give up call `wait_all()` first.
/// It does not wait for the drain: a copy in progress is stopped and its temporary removed, and
/// the next Snapshotter on the same roots drains what is missing; call drain_wait() first to
/// have everything durable.
class TSNAP_API Snapshotter {
 public:
  /// Starts the io thread; with a fixed budget, makes the staging pool and faults it in on
  /// every core (1.5 GB: 0.2-0.7 s on a 2-core VM), so that no save pays for fresh pages.
  /// Errors: InvalidArgument for bad options; IoError if the root cannot be created.
  explicit Snapshotter(SnapshotterOptions options);
  ~Snapshotter();
  Snapshotter(const Snapshotter&) = delete;
  Snapshotter& operator=(const Snapshotter&) = delete;

  /// Starts saving `state` as `<root>/<name>`. Returns when every tensor is staged (eager) or at
  /// once (lazy); the snapshot is point-in-time exact from then on (lazy: from wait_staged()).
  /// Errors thrown here: InvalidArgument (bad name, bad dtype), Error(kAlreadyExists) when the
  /// snapshot exists or an earlier save of `name` by this Snapshotter is still in flight (found
  /// before anything is staged), Error(kBusy). With `options.overwrite`, a save of a name that
  /// is still in flight is ordered after it: the call waits for that save's handle to complete
  /// (like InFlightPolicy::kWait; with kFailFast it throws kBusy instead), so the later save's
  /// snapshot is the one that stays. Later errors complete the handle.
  /// `metadata` is a JSON object (or null for none) stored in the manifest.
  SaveHandle save_async(const std::string& name, const StateDict& state,
                        const nlohmann::json& metadata = nlohmann::json::object(),
                        const SaveOptions& options = {});
  /// Saves a multi-object checkpoint (its flattened state and metadata).
  SaveHandle save_async(const std::string& name, const Checkpoint& checkpoint,
                        const SaveOptions& options = {});

  /// With the automatic staging budget, sizes the staging pool for saves of `state` (as the
  /// first save would) and faults it in now, on every core, so that the first save stalls no
  /// longer than the later ones: call it once before the training loop, with the state complete
  /// (an optimizer makes its moments at its first step; PeriodicSnapshots prepares at its
  /// first after_step). Takes nothing from `state` but its layout. A no-op once the pool exists
  /// (a fixed budget, an earlier prepare or save). Errors: as save_async's planning
  /// (InvalidArgument for bad options or keys).
  void prepare(const StateDict& state, const SaveOptions& options = {});
  /// prepare() for a multi-object checkpoint's flattened state.
  void prepare(const Checkpoint& checkpoint, const SaveOptions& options = {});

  /// With a group: tells the other ranks that this rank will not take part in its next save of
  /// `name` (e.g. building its state failed), so their saves of it fail at once with
  /// Error(kPeerFailed) naming this rank and `reason`, instead of waiting for its part until
  /// the group's timeout; later saves are not affected (ranks agree on saves by name). Call it
  /// instead of that save_async. Without a group it does nothing. Never throws.
  void abandon(const std::string& name, const std::string& reason) noexcept;

  /// Waits for every save in flight; does not throw (each handle keeps its error).
  void wait_all();
  /// The root directory.
  const std::filesystem::path& root() const;
  /// The engine in use ("io_uring" or "pwrite") and whether O_DIRECT is on.
  std::string engine_name() const;
  /// The staging budget in use: the option, or with automatic sizing 0 until the first save
  /// and the chosen size after it.
  uint64_t staging_budget_bytes() const;
  /// The group of a distributed Snapshotter (SnapshotterOptions::group), null otherwise.
  const std::shared_ptr<DistGroup>& group() const;
  /// The newest committed snapshot under root and, with a durable tier, under durable_root
  /// (format.md's age rule; on a tie the local one), if any.
  std::optional<std::filesystem::path> latest() const;
  /// With `keep_hot`: the last snapshot this Snapshotter committed, whose bytes are still in
  /// the staging pool; an empty handle when there is none (keep_hot off, nothing committed yet,
  /// or evicted by a save that needed the buffers). A save's image is installed before its
  /// handle completes, so after `h.wait()` this is that save's (or a newer one's).
  HotSnapshot hot_snapshot() const;

  /// The durable tier's root (SnapshotterOptions::tier.durable_root); empty without one.
  const std::filesystem::path& durable_root() const;
  /// The durable tier's options (SnapshotterOptions::tier).
  const TierOptions& tier() const;
  /// Blocks until every snapshot committed under root before the call is drained to the
  /// durable tier (or its drain failed; a drain that failed before for a reason other than bad
  /// local bytes is retried first). Throws the first drain failure not thrown yet whose
  /// snapshot has not drained since (IoError, FormatError kHashMismatch/kTruncated naming the
  /// local file and chunk, ...). Returns at once without a durable tier. Thread-safe.
  void drain_wait();
  /// True when the committed local snapshot `name` is in the durable tier (the same save), or
  /// was and was removed there by retention. False without a durable tier.
  bool drained(const std::string& name) const;
  /// The drain's figures so far.
  DrainStats drain_stats() const;
  /// Adds `fn`, called with each drain's record (success or failure) on the drain thread,
  /// after local_keep_last ran; it must not call drain_wait. Returns an id for
  /// remove_drain_listener. An exception it throws is swallowed.
  int add_drain_listener(std::function<void(const DrainRecord&)> fn);
  /// Removes a listener; once it returns, the listener is not running and is never called again.
  void remove_drain_listener(int id);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Reserves `bytes` of staging memory for the next staging pool made in this process (a
/// Snapshotter's, with the automatic budget at its first save or prepare(), or with a fixed
/// one at construction), and faults it in on a background thread at a lower priority (on the
/// caller when `wait`). That pool takes the reservation, resized to the bytes it needs, and
/// keeps the pages faulted in so far, so that its making (the first save's stall, with the
/// automatic budget) costs about a copy into warm memory. For code that knows the state's size
/// before it knows the root it will save to (a trainer plugin, after the first optimizer step):
/// otherwise prepare() does the same. Size it as the pool: the state's stored bytes plus a
/// chunk per I/O thread, twice with keep_hot; a smaller reservation still saves its share.
/// One reservation per process: a new one replaces the last; 0 releases it. Pinned pools (with
/// CUDA) and a snapshot agent's shared pool do not take it. Errors: IoError when the memory
/// cannot be mapped. Thread-safe.
TSNAP_API void reserve_staging_memory(uint64_t bytes, bool wait = false);
/// Bytes of staging memory reserved and not yet taken by a pool.
TSNAP_API uint64_t reserved_staging_bytes();

}  // namespace tsnap
