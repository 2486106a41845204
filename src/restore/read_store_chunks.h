#pragma once
// Reads of a snapshot that lives behind a format::StorageRoot other than a local directory
// (object storage): a ReadPlan served by ranged reads (StorageRoot::read) of exactly the
// byte ranges the plan reads, kFetchThreads at once, straight into read buffers, then checked,
// hashed and scattered into the targets as every read is (restore/chunk_source.h). No local
// copy is made and no byte is read twice: a load of some keys, or of one rank's pieces, reads
// only the chunks that hold them, each once however many pieces share it.

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "format/storage_root.h"
#include "restore/read_chunks.h"

namespace tsnap::restore {

/// Ranged reads in flight at once.
inline constexpr int kFetchThreads = 8;

/// One snapshot of a root, for the reads of a load: its manifest, and the sizes of its files
/// (one listing, made on first need) against which a read is checked before any buffer is
/// sized by the manifest. Thread-safety: one thread at a time. Ownership: refers to `root`
/// and `manifest`, which must outlive it.
class StoredSnapshot {
 public:
  StoredSnapshot(const format::StorageRoot& root, std::string name, const Manifest& manifest)
      : root_(root), name_(std::move(name)), manifest_(manifest) {}

  const format::StorageRoot& root() const { return root_; }
  const std::string& name() const { return name_; }
  const Manifest& manifest() const { return manifest_; }
  /// Checks that every file of `files` is there at its manifest size. Errors:
  /// IoError(kNotFound) naming a missing file; FormatError(kTruncated) naming a file shorter
  /// than the manifest says, kBadManifest for one longer; IoError from the root.
  void check_files(const std::vector<const FileRecord*>& files);

 private:
  const format::StorageRoot& root_;
  const std::string name_;
  const Manifest& manifest_;
  std::optional<std::map<std::string, uint64_t>> sizes_;
};

/// Reads `plan` (made from `targets` of `snapshot`'s manifest) into `targets` by ranged reads;
/// see the file comment. Uses options.verify, atomic and read_budget_bytes. Errors: as
/// tsnap::load_into; a failed read is the root's error (naming the object and operation).
ReadStats read_store_chunks(StoredSnapshot& snapshot, const std::vector<Target>& targets,
                            const ReadPlan& plan, const LoadOptions& options, bool in_place);

}  // namespace tsnap::restore
