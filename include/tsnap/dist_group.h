#pragma once
/// \file
/// `tsnap::DistGroup`: the ranks of a distributed save and how they agree, over a c10d `Store`
/// (LibTorch's rendezvous key-value store: `TCPStore` across machines). Pass one to
/// `SnapshotterOptions::group` and every rank's `save_async` writes its part of one snapshot:
/// its pieces of sharded tensors and its share of the replicated ones; rank 0 commits once every
/// rank's files are durable, and every rank's handle completes with the same outcome.
///
/// Coordination runs on tsnap's commit threads through the store, never as a collective on the
/// training thread or on the training's own process group (Gloo/NCCL).

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <memory>
#include <string>

#include "tsnap/export.h"

namespace c10d {
class Store;
}  // namespace c10d

namespace tsnap {

namespace dist {
class Coordinator;
}  // namespace dist

/// Options of a DistGroup.
struct TSNAP_API DistOptions {
  /// How long rank 0 waits for the other ranks' parts once its own is durable, and the other
  /// ranks for rank 0's verdict (twice this); a rank that is dead or stuck longer fails the save
  /// on every rank with Error(kPeerFailed) naming it.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  /// Prefix of tsnap's keys in the store: one DistGroup per prefix and store.
  std::string prefix = "tsnap";
};

/// A group of ranks that save snapshots together.
/// Thread-safety: immutable once built; shared by the Snapshotters of one process.
/// Ownership: keeps a reference to the store.
class TSNAP_API DistGroup {
 public:
  /// Joins rank `rank` of `world_size` over `store`, which every rank shares (for example the
  /// TCPStore that also rendezvouses the training's process group, or a PrefixStore over it).
  /// Blocks until rank 0 has published the group's id, like creating a process group.
  /// Errors: InvalidArgument for a rank outside [0, world_size); Error(kPeerFailed) when rank 0
  /// does not publish within the timeout.
  DistGroup(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
            DistOptions options = {});
  ~DistGroup();
  DistGroup(const DistGroup&) = delete;
  DistGroup& operator=(const DistGroup&) = delete;

  /// The group a torchrun-style launcher describes: RANK, WORLD_SIZE, MASTER_ADDR and
  /// MASTER_PORT; rank 0 hosts a TCPStore on MASTER_ADDR:MASTER_PORT, the others connect to it.
  /// Errors: InvalidArgument naming a missing or malformed variable; Error(kPeerFailed) when
  /// the store cannot be reached within the timeout.
  static std::shared_ptr<DistGroup> from_env(DistOptions options = {});

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  /// The store (to build the training's own process group on it, under another prefix).
  const c10::intrusive_ptr<c10d::Store>& store() const;
  /// Internal: what distributed saves coordinate through.
  const std::shared_ptr<dist::Coordinator>& coordinator() const { return coordinator_; }

 private:
  int rank_;
  int world_size_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::shared_ptr<dist::Coordinator> coordinator_;
};

}  // namespace tsnap
