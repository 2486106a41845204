#pragma once
// One save from plan to commit: stages every chunk (eager on the caller's thread, or lazy on
// the blocking pool), hands each staged buffer to the engine, hashes it (XXH3-64) when its
// write completes (overlapping I/O, off the caller's stall), and when the last write
// completes, commits on the blocking pool (or cleans up after an error) and completes the
// handle. In a distributed save each rank's job writes its own files into the shared temporary
// directory and rank 0 commits for all (coordinate()). Owned by shared_ptr: the engine
// callbacks keep it alive.

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "common/progress_meter.h"
#include "dist/coordinator.h"
#include "format/manifest_io.h"
#include "pipeline/agent_client.h"
#include "pipeline/commit.h"
#include "pipeline/resources.h"
#include "pipeline/reuse.h"
#include "pipeline/save_state.h"
#include "plan/plan.h"
#include "stage/fill.h"
#include "stage/hot_image.h"
#include "tsnap/manifest.h"
#include "tsnap/save_options.h"

namespace tsnap::pipeline {

class SaveJob : public std::enable_shared_from_this<SaveJob> {
 public:
  using Clock = std::chrono::steady_clock;

  /// What an incremental save learned for the next one's layout (plan::Layout::unchanged):
  /// each key's signature (the XXH3-64 of each of its pieces within a chunk, with the piece's
  /// offset in the tensor: equal signatures of the same layout mean equal bytes), and the keys
  /// of stable files laid out anew, whose signatures cannot be compared with the previous
  /// save's (assumed still unchanged; a change shows at the next comparison).
  /// And, for a full save, its plan without the caller's tensors, which a later save of a
  /// state alike reuses (plan::Layout::previous); absent where it cannot be reused.
  struct Learned {
    std::map<std::string, std::vector<uint64_t>> signatures;
    std::set<std::string> carried;
    std::optional<plan::Plan> plan;
  };
  /// The save this one is compared with to find its unchanged tensors (the last one its
  /// Snapshotter committed), with what the stale check needs (SaveOptions::step and ::stale).
  struct Comparison {
    std::string since;  // that save's snapshot name; empty: none
    std::optional<int64_t> since_step;
    std::shared_ptr<const std::map<std::string, std::vector<uint64_t>>> signatures;
    std::optional<int64_t> step;  // this save's
    StaleCheck stale;
  };
  /// Admission bookkeeping: `release_slot(committed, learned)` runs just before the handle
  /// completes (so that a save started once wait() returns is admitted, and sees this one as
  /// its incremental base, with what it learned), `on_completed` just after (wait_all()).
  /// With a `coordinator` the save is this rank's part of a distributed save (see
  /// coordinate()); without one it commits alone.
  SaveJob(Resources& res, plan::Plan plan, CommitPaths paths, nlohmann::json metadata,
          bool overwrite, std::shared_ptr<dist::Coordinator> coordinator, Clock::time_point started,
          std::function<void(bool, Learned)> release_slot, std::function<void()> on_completed,
          ProgressFn progress = {});

  /// Creates the temporary directory and opens the shard files; throws on failure (nothing is
  /// left behind).
  void open_files();
  /// The staging sources (stage::prepare_sources) of every file, on the caller's thread: a
  /// device tensor's event must follow the work on the caller's current stream. stage() does
  /// it when it was not done; a lazy save does it before handing stage() to another thread.
  /// An error (of a conversion on the device) is kept for stage(), which fails the save.
  void prepare_sources() noexcept;
  /// Stages every chunk and submits its write; never throws (errors complete the handle).
  void stage(bool lazy = false);  // lazy: on the lazy arena (Resources)

  const std::shared_ptr<detail::SaveState>& state() const { return state_; }
  /// keep_hot (before stage()): each written chunk's buffer goes to `image` instead of back to
  /// the pool, and a successful commit installs it (stage/hot_image.h). A distributed save's
  /// image also takes the plan's memory-only files (plan::add_memory_files) and gets this
  /// rank's view of the manifest: its files and those.
  void keep_hot(std::shared_ptr<stage::HotImage> image) { hot_ = std::move(image); }
  /// keep_hot, before stage(): hands the save to a snapshot agent once it is staged, before
  /// the caller is released (tsnap/agent.h), and tells it how the save ended.
  void guard_with(std::shared_ptr<AgentClient> agent);
  /// Before stage(): what to compare this save with (Comparison).
  void compare_with(Comparison comparison) { comparison_ = std::move(comparison); }

 private:
  void stage_chunk(size_t index, const std::vector<stage::Sources>& sources);
  // Submits the write of a staged chunk; `hash` when already known (incremental), else the
  // chunk is hashed when the write completes.
  void submit(plan::ChunkRef ref, int buf, uint64_t len, std::optional<uint64_t> hash);
  // submit() of a chunk whose write was held back (DeferredWrites): a failure fails the save.
  void submit_held(plan::ChunkRef ref, int buf, uint64_t len) noexcept;
  // Incremental: hashes a staged chunk of a file with base hashes and writes it only when it
  // differs from the base file's chunk.
  void compare_and_submit(plan::ChunkRef ref, int buf, uint64_t len);
  // Incremental, after every shard is closed: files whose chunks all equal the base's become
  // links to (or copies of) the base files; skipped chunks of the others are copied in.
  void reuse_base_files();
  // The hash of chunk `ref` (its `len` staged bytes at `data`) and, in the same pass, of the
  // piece of each tensor it holds, into piece_hashes_ (one thread per chunk, so no lock).
  uint64_t hash_chunk(plan::ChunkRef ref, const uint8_t* data, uint64_t len);
  // What the next save's layout learns from this one (Learned).
  Learned learned() const;
  // Once every chunk is hashed: learned_, the tensors unchanged since comparison_.since
  // (unchanged_) and those of them that must change (stale_). Returns Error(kStale) when the
  // stale check fails the save.
  std::exception_ptr compare();
  void write_done(uint32_t file, uint64_t offset, int rc);
  void fail(std::exception_ptr e);
  void release_token();
  void finish();
  // keep_hot: installs the image with `manifest` (as committed, or a rank's view). Best
  // effort: the snapshot is committed whatever happens here.
  void hot_commit(const std::function<Manifest()>& manifest) noexcept;
  // Stages a memory-only chunk (into the hot image, hashed for its loads; never written).
  void keep_in_memory(plan::ChunkRef ref, int buf, uint64_t len);
  // This rank's manifest part: the written files, or with `memory` the memory-only ones too;
  // without `tensors`, no tensor records (their text is tensor_text_).
  // Without `hashes`, every chunk hash is 0 (before the writes complete).
  Manifest manifest(bool memory = false, bool tensors = true, bool hashes = true) const;
  // The tensor records of plan files [0, files) into m.tensors.
  void add_tensor_records(Manifest& m, size_t files) const;
  // A save alone: the text of its manifest's tensor records (tensor_text_), rendered on the
  // blocking pool once staging ends, while the chunks are written; on failure the commit
  // renders it again and reports the error.
  void render_tensor_records() noexcept;
  // guard_with(): hands the staged save to the agent; returns the save's error when it could
  // not and the link does not fall back.
  std::exception_ptr hand_to_agent() noexcept;
  std::exception_ptr coordinate(std::exception_ptr error, uint64_t* manifest_bytes,
                                std::string* leftover);

  Resources& res_;
  plan::Plan plan_;
  CommitPaths paths_;
  nlohmann::json metadata_;
  bool overwrite_;
  std::shared_ptr<dist::Coordinator> coordinator_;
  Clock::time_point started_;
  std::function<void(bool, Learned)> release_slot_;
  std::function<void()> on_completed_;
  std::shared_ptr<detail::SaveState> state_;
  detail::ProgressMeter progress_;

  std::vector<int> fds_;
  std::vector<std::unique_ptr<BaseFile>> base_files_;  // per file; null: no base to reuse
  std::vector<std::vector<uint8_t>> skipped_;          // per file, per chunk: equal to the base
  std::vector<bool> reused_whole_;                     // per file: linked or copied whole
  std::vector<std::vector<uint64_t>> hashes_;          // per file, per chunk
  // Per file, per chunk, the hash of each tensor piece it holds (in order): the signatures of
  // Learned, which find the tensors unchanged since the previous save.
  std::vector<std::vector<std::vector<uint64_t>>> piece_hashes_;
  std::atomic<uint64_t> pending_{1};  // writes not completed, +1 while staging or rendering
  // Eager staging into a pool with a free buffer for every chunk: the writes start once
  // staging ends (right after the caller is released), so that the io thread's writes and
  // hashes do not share the cores and the memory bandwidth with the copy the caller waits for
  // (measured on 2 cores: a steadier stall, 0.90-0.97x the memcpy floor, and a durable time no
  // longer). A pool that cannot hold the save writes as it stages: its buffers come back only
  // from completed writes. So does a save staged while another holds its writes back: at most
  // one save holds unwritten buffers, and any wait for a buffer releases them
  // (Resources::deferred, deferred_writes.h), so every wait for a buffer ends.
  std::vector<stage::Sources> sources_;  // per file, from prepare_sources to staging's end
  bool prepared_ = false;
  format::ManifestTensorText tensor_text_;  // see render_tensor_records()
  bool tensor_text_ready_ = false;
  std::exception_ptr sources_error_;
  uint64_t defer_ticket_ = 0;  // DeferredWrites' ticket; 0: the writes are not held back
  std::atomic<bool> failed_{false};
  bool keep_temporary_ = false;  // distributed: rank 0 went silent and may still commit
  double coordinate_s_ = 0;      // distributed: waiting for the other ranks / rank 0's verdict
  std::mutex error_mu_;
  std::exception_ptr error_;
  std::atomic<uint64_t> buffer_waits_{0}, buffers_reused_{0};
  std::atomic<uint64_t> skipped_bytes_{0};
  uint64_t linked_bytes_ = 0;
  std::atomic<int64_t> first_write_ns_{0}, last_write_ns_{0};
  std::shared_ptr<stage::HotImage> hot_;  // keep_hot: the image this save fills
  std::shared_ptr<AgentClient> agent_;    // guard_with()
  uint64_t agent_seq_ = 0;
  std::vector<std::vector<int>> chunk_bufs_;  // with an agent: per file, per chunk, its buffer
  std::atomic<bool> guarded_{false};          // the agent holds the save
  std::string committed_text_;                // the manifest as committed (for the agent)
  Comparison comparison_;
  Learned learned_;                     // see compare()
  std::vector<std::string> unchanged_;  // sorted
  std::vector<std::string> stale_;      // sorted
};

}  // namespace tsnap::pipeline
