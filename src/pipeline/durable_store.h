#pragma once
/// \file
/// The write side of a durable root: what the drain (pipeline/drain.h) writes a committed local
/// snapshot into, behind one interface, so that the drain has one copy path whatever the root
/// is. The read side (listing, manifests, byte ranges, removal) is format::StorageRoot; this
/// adds what only a writer needs: which saves the root holds, whether a save is settled there,
/// and a save in progress that takes files one at a time and publishes its manifest last.
/// Two implementations, each in its own unit:
///   - a directory (pipeline/dir_store.h): files go into a temporary directory, the commit
///     protocol of every save (pipeline/commit.h) renames it into place;
///   - object storage (pipeline/s3_store.h): each file is one object (one PUT, or a multipart
///     upload resumed after a kill), the manifest is PUT last and only where none is.
///
/// A save is begun alone (one writer holds all its files: a failure leaves nothing listed) or
/// shared (node-local roots, TierOptions::node_local: the ranks of every node write the files
/// their node holds into the same save, and whichever rank finds every file in place publishes
/// it; a rank that dies leaves the save unpublished for a later drain to complete).
///
/// Thread-safety: a store and its saves are used by the drain thread alone (a save's write may
/// run threads of its own and joins them). Ownership: a store owns its root's lock (directory)
/// or shares the process's client (object storage); a save owns its temporary state.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "format/open_file.h"
#include "io/engine.h"
#include "tsnap/manifest.h"
#include "tsnap/snapshotter.h"

namespace tsnap::pipeline {

/// What a durable store needs from its drain.
struct DurableConfig {
  std::filesystem::path root;  ///< A directory, or "s3://bucket/prefix".
  /// The engine for a directory's writes, fsyncs and renames.
  std::shared_ptr<io::Engine> engine;
  /// Called with the size of each piece of bytes before it leaves (the drain's rate limit); it
  /// may throw to stop the write (the drain is being destroyed).
  std::function<void(uint64_t)> pace;
  /// Node-local roots: this rank's number in its group (names its part files); -1 otherwise.
  int node_rank = -1;
};

/// A local shard file being written out: reads ranges of whole chunks (the last one may be
/// short) and checks each chunk's XXH3-64 against the manifest before anything of it is
/// handed over, so that no byte the manifest does not vouch for reaches a durable root.
/// Thread-safety: read() may run on several threads at once. Ownership: refers to `file` and
/// `record`, which must outlive it.
class CheckedSource {
 public:
  /// `label` names the local file in messages; `target` names where it goes.
  CheckedSource(const format::OpenedFile& file, std::string label, const FileRecord& record,
                std::string target);

  const FileRecord& record() const { return record_; }
  /// Where the file goes, as messages name it.
  const std::string& target() const { return target_; }
  /// Errors: FormatError kTruncated (shorter) or kBadManifest (longer) when the local file is
  /// not the manifest's size.
  void check_size() const;
  /// Reads bytes [begin, begin + len) into `out`; `begin` is a chunk boundary. Errors:
  /// FormatError kTruncated when the file ends early, kHashMismatch naming the chunk and its
  /// byte range; IoError when it cannot be read.
  void read(uint64_t begin, size_t len, uint8_t* out) const;
  /// Drops the file's pages from the page cache (a copy, not a reader's data).
  void release() const;

 private:
  const format::OpenedFile& file_;
  std::string label_;
  const FileRecord& record_;
  std::string target_;
};

/// One save being written into a durable root; see the file comment.
class DurableSave {
 public:
  virtual ~DurableSave() = default;
  /// The files of the save in place already (a shared save: written by this node's other
  /// ranks, other nodes, or a drain that was killed). Errors: IoError.
  virtual std::set<std::string> in_place() = 0;
  /// Whether file `f` is in place now (asked again once this rank holds its claim).
  virtual bool has(const FileRecord& f) = 0;
  /// Places `f` without copying its bytes where the root can (a directory: a hard link to the
  /// durable copy of the snapshot an incremental save reused the file from, when it holds the
  /// same file); false: it must be written.
  virtual bool link(const FileRecord& f) { return false; }
  /// Writes the file `src` reads, paced, each chunk checked before it leaves; adds the bytes
  /// sent (and resumed) to `record`. Errors: those of CheckedSource, IoError from the root.
  virtual void write(const CheckedSource& src, DrainRecord& record) = 0;
  /// Publishes the save with `manifest_text` (its manifest's exact bytes) last, once every
  /// file is in place; returns false when it is not (a shared save that other ranks are still
  /// writing) or another rank of a shared save published it meanwhile. Adds the manifest's
  /// bytes to `record`. Errors: Error(kAlreadyExists) when another writer published a different
  /// save of this name meanwhile; IoError.
  virtual bool publish(const std::string& manifest_text, DrainRecord& record) = 0;
  /// Where file `f` goes, as messages name it.
  virtual std::string where(const FileRecord& f) const = 0;
};

/// A durable root's write side; see the file comment.
class DurableStore {
 public:
  /// The store of `config.root`. A directory is created and locked here (its stale temporaries
  /// removed when no other writer is alive); object storage checks only the URL. Errors:
  /// IoError when the directory cannot be created or opened; InvalidArgument for a bad URL.
  static std::unique_ptr<DurableStore> open(DurableConfig config);
  virtual ~DurableStore() = default;

  /// Whether the store is remote (it may be down or refuse the credentials): the drain then
  /// asks it on its own thread, so that this fails drains, never the Snapshotter.
  virtual bool remote() const = 0;
  /// The saves the root holds committed, as (name, id); object storage also learns which
  /// uploads a killed drain left (resumed by later writes, stale ones aborted). Errors: IoError.
  virtual std::vector<std::pair<std::string, std::string>> saves() = 0;
  /// Whether the root holds save `m` of `name` already, or a newer one (nothing to write).
  /// Otherwise an older save of the name there stops being listed (object storage; a
  /// directory exchanges it atomically at the commit). Errors: IoError.
  virtual bool settled(const std::string& name, const Manifest& m) = 0;
  /// Begins save `m` of `name`, alone or `shared` by the ranks of a group. Errors: IoError.
  virtual std::unique_ptr<DurableSave> begin(const std::string& name, const Manifest& m,
                                             bool shared) = 0;
};

}  // namespace tsnap::pipeline
