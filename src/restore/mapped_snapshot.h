#pragma once
// A snapshot mapped for reading, without LibTorch: the manifest, and each shard opened
// (relative to the snapshot directory opened with it, so it reads the tree it was opened on),
// checked against the manifest (ShardReader) and mapped privately (copy-on-write) on first use;
// verified chunks are remembered so each is hashed at most once. The lazy reader
// (tsnap::open) wraps its bytes into tensors; the command-line tool reads them as they are.
//
// Thread-safety: every method is const and may be called from any thread. Ownership: the
// mappings live as long as the object; share it (shared_ptr) with whatever points into them.

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "format/open_file.h"
#include "restore/read_plan.h"
#include "restore/reshard.h"
#include "tsnap/manifest.h"

namespace tsnap::restore {

class FetchedSnapshot;
class ShardReader;

class MappedSnapshot {
 public:
  /// Opens the snapshot at `path` (a directory, or "s3://bucket/prefix/name", fetched to a
  /// local copy that lives as long as this object) and reads its manifest. `verify`: check
  /// the XXH3-64 of every chunk a read touches. Errors: those of read_manifest.
  static std::shared_ptr<const MappedSnapshot> open(const std::filesystem::path& path, bool verify);
  MappedSnapshot(const format::SnapshotDir& dir, bool verify);
  ~MappedSnapshot();

  const Manifest& manifest() const { return manifest_; }
  /// The directory it reads (the local copy for object storage).
  const std::filesystem::path& path() const { return dir_.path; }
  /// The (first) record of `key`, or nullptr.
  const TensorRecord* find(const std::string& key) const;
  /// True when `key` is stored as several pieces (a distributed save of sharded state).
  bool pieced(const std::string& key) const { return pieced_.count(key) != 0; }

  /// Bytes [begin, end) of `r`'s shard file, mapped (and their chunks verified when the
  /// snapshot was opened with `verify`); null for an empty range, which opens nothing. Valid
  /// as long as this object. Errors: IoError for a
  /// missing shard, FormatError for one that disagrees with the manifest or a hash mismatch
  /// naming file and chunk.
  const uint8_t* bytes(const TensorRecord& r, uint64_t begin, uint64_t end) const;

  /// Writes the box `want` of the global tensor stored as `pieces` (densely, row-major, in
  /// the stored dtype) to `out`. Errors: those of `bytes`; Unsupported when the pieces do not
  /// cover the box.
  void read_box(const std::vector<const TensorRecord*>& pieces, const Box& want,
                uint8_t* out) const;

 private:
  struct Mapping;
  const Mapping& mapping(const std::string& file) const;

  std::shared_ptr<const FetchedSnapshot> fetched_;  // the local copy of an s3:// one (last to go)
  format::SnapshotDir dir_;                         // its own descriptor of the directory opened
  bool verify_;
  Manifest manifest_;
  RecordIndex index_;  // into manifest_
  std::set<std::string> pieced_;
  std::unordered_map<std::string, size_t> file_index_;
  mutable std::mutex mu_;
  mutable std::vector<std::unique_ptr<Mapping>> maps_;  // by file index, made on first use
};

}  // namespace tsnap::restore
