#pragma once
/// \file
/// `tsnap::Agent`: a snapshot agent, a process of its own (one per node, started as
/// `tsnap agent --socket PATH` or by embedding this class) that holds what trainers staged, so
/// that a save outlives the trainer that made it.
///
/// A Snapshotter made with `SnapshotterOptions::agent.socket` links to the agent at that path.
/// Its staging pool is then shared memory (a memfd the agent maps too), and each save is handed
/// to the agent the moment it is staged, before `save_async` returns (for a lazy save: before
/// `wait_staged` returns): the agent then holds the save's manifest and the buffers of its
/// chunks. The trainer writes and commits the save itself as usual and tells the agent how it
/// ended. If the trainer dies first (kill -9, OOM killer, a crash), the agent sees its link
/// close and commits every save the trainer had handed over and not committed, from that
/// memory, with the same commit protocol (files, then MANIFEST.json, then an atomic rename):
/// every save whose `save_async` returned is committed, whatever happens to the trainer after.
///
/// The agent also keeps the trainer's pool when it dies, with the last snapshot committed in
/// it. A trainer restarted on the same root adopts that pool: its `Snapshotter::hot_snapshot()`
/// is then that snapshot, read from memory (every chunk verified against the manifest's
/// hashes) without touching the disk, and `PeriodicSnapshots::resume` loads from it.
///
/// Who owns which memory when:
///   - staging: the trainer writes the buffers of a save while it stages it; nobody else does;
///   - handed over (guard): the buffers are the save's until the trainer says it ended; neither
///     side reuses them, and a pool that runs short waits for that save to commit;
///   - committed: the buffers hold the trainer's hot snapshot until a newer save needs them;
///   - trainer dead: the agent holds the pool; it writes what was handed over, and gives the
///     pool to the next trainer of the root.
///
/// Edges: a trainer whose agent is gone fails its saves (IoError naming the socket) or, with
/// `agent.fall_back`, keeps saving in-process without the guarantee; an agent killed holds
/// nothing afterwards (the trainers' own commits still complete); a second live trainer on
/// the same root is refused (kBusy), trainers on other roots share one agent; a save is never
/// committed half, by either side. Saves of a Snapshotter with a group are not handed to an
/// agent yet (the option is refused with one).
///
/// Thread-safety: an Agent serves its links on threads of its own; its methods are
/// thread-safe. Ownership: owns the listening socket (its file is removed on destruction) and
/// the pools it holds; destruction closes every link without committing for live trainers.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "tsnap/export.h"

namespace tsnap {

/// Options of an Agent.
struct TSNAP_API AgentOptions {
  /// The Unix socket path trainers link to (at most 107 bytes). A stale socket file there (its
  /// agent died) is replaced.
  std::filesystem::path socket;
  /// Where the agent reports what it does on its own (commits for trainers that died, links
  /// refused, failures); empty: standard error.
  std::function<void(const std::string&)> log;
};

/// A snapshot agent; see the file comment.
class TSNAP_API Agent {
 public:
  /// Listens at `options.socket` and serves on threads of its own. Errors: Error(kAlreadyExists)
  /// when another agent listens there; IoError when the socket cannot be made.
  explicit Agent(AgentOptions options);
  /// Closes every link (live trainers' saves are theirs to commit) and removes the socket file.
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  const std::filesystem::path& socket() const;
  /// Trainers linked now.
  size_t links() const;
  /// Saves this agent committed for trainers that died.
  uint64_t commits() const;
  /// Waits until no trainer is linked (each dead one's saves committed).
  void wait_unlinked() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tsnap
