#pragma once
// One shard file of a committed snapshot, opened and checked against the manifest: it exists,
// its size is exact (truncation), and its safetensors header describes the same tensors. The
// restore paths (load, load_into, the lazy reader, verify) all open shards through it, so every
// one of them reports a missing, truncated or corrupt shard with the same error.

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>

#include "format/open_file.h"
#include "io/fd.h"
#include "tsnap/manifest.h"

namespace tsnap::restore {

/// The checks of one shard's chunks against its manifest record, and the errors that name
/// them: for chunks read from the file (ShardReader) and for chunks held in memory (a hot
/// snapshot's staging buffers), so that both report a bad chunk alike. `file` must outlive it.
class ChunkCheck {
 public:
  /// `path` labels the errors; `what` is what a mismatch says is corrupt ("the file").
  ChunkCheck(const FileRecord& file, std::string path, std::string what = "the file");

  /// Bytes of chunk `c` (chunk_bytes, or less for the last one).
  uint64_t chunk_length(uint64_t c) const;
  /// Whether chunk `c` (already read into `buf`, `len` bytes) has the recorded hash.
  bool chunk_ok(uint64_t c, const uint8_t* buf, uint64_t len) const;
  /// Whether `hash` (XXH3-64 of chunk `c`'s bytes, hashed by the caller) is the recorded one.
  bool hash_ok(uint64_t c, uint64_t hash) const;
  /// FormatError(kHashMismatch) naming the file, chunk `c` and its offset.
  [[noreturn]] void throw_hash_mismatch(uint64_t c) const;
  /// FormatError(kTruncated): the file ended at offset `end`, inside chunk `c`.
  [[noreturn]] void throw_short_chunk(uint64_t c, uint64_t end) const;

  const FileRecord& file() const { return file_; }
  const std::string& path() const { return path_; }

 private:
  const FileRecord& file_;
  std::string path_;
  std::string what_;
};

class ShardReader : public ChunkCheck {
 public:
  /// Opens `file.name` in `dir` (buffered, read-only, relative to the directory's descriptor)
  /// and checks its size and its safetensors header against `file` and the manifest's tensors.
  /// `file` must outlive the reader. Errors: those of format::open_snapshot_file (missing,
  /// link, not a regular file), FormatError(kTruncated) naming the sizes,
  /// FormatError(kBadManifest) for a header that disagrees with the manifest, IoError.
  ShardReader(const format::SnapshotDir& dir, const FileRecord& file, const Manifest& manifest);
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  /// Reads chunk `c` into `buf` (at least chunk_length(c) long) with pread; returns its length.
  /// With `verify`, throws FormatError(kHashMismatch) naming file, chunk and offset.
  /// Thread-safe.
  uint64_t read_chunk(uint64_t c, uint8_t* buf, bool verify) const;
  /// Fraction (0..1) of the file's pages that are in the page cache now (mincore); 0 when it
  /// cannot be told.
  double cached_fraction() const;

  /// The buffered descriptor (owned; closed by the destructor).
  int fd() const { return fd_.get(); }

 private:
  io::UniqueFd fd_;
};

}  // namespace tsnap::restore
