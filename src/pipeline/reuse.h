#pragma once
// How an incremental save takes bytes from the base snapshot's files (plan::Base) instead of
// writing them: a file whose chunks all equal the base file's becomes a hard link to that file
// (no new bytes, no new space); a file with some equal chunks gets those chunks copied by the
// kernel (copy_file_range: a reflink on filesystems that share extents). The base file is
// opened when the save starts, so a retention or overwrite that deletes the base snapshot
// meanwhile cannot take the bytes away: the link then falls back to a copy from that
// descriptor. Every snapshot stays self-contained (its own directory entry for every file), so
// deleting any snapshot never breaks another.
//
// Nothing is reused on the base manifest's word alone: a chunk is skipped only once the base
// file's bytes have been read and hashed to the value the new chunk has (`holds`), so a base
// that rotted, was modified in place or swapped for another file is written afresh instead of
// spreading into the new snapshot. The proof is made while the chunk is staged, and the link or
// copy happens at the commit; two things keep another process from slipping bytes in between:
//   - a link is made from the descriptor opened and proven (linkat(AT_EMPTY_PATH), or through
//     /proc/self/fd), never from the path, which a rename may have pointed at another file;
//   - after linking or copying, the new snapshot's file is read back and each reused chunk
//     hashed again (`check_reused`), so a base rewritten in place after its proof fails the save
//     (nothing is committed) instead of committing a chunk that fails verify.

#include <sys/types.h>

#include <cstdint>
#include <ctime>
#include <string>
#include <utility>
#include <vector>

#include "io/fd.h"

namespace tsnap::pipeline {

/// A base snapshot's file, opened read-only.
class BaseFile {
 public:
  /// Opens `path` when it is a regular file of exactly `size` bytes; otherwise !valid() (the
  /// save then writes that file in full).
  BaseFile(std::string path, uint64_t size);
  bool valid() const { return fd_.get() >= 0; }
  const std::string& path() const { return path_; }

  /// Whether bytes [begin, end) of the opened file hash (XXH3-64) to `hash`: read and hashed
  /// now, so that what is reused is proven equal to what it stands for. False on a read error.
  /// Thread-safe (positional reads).
  bool holds(uint64_t begin, uint64_t end, uint64_t hash) const;

  /// Makes `target` (which must not exist) hold this file whole: a hard link to the file
  /// opened (from its descriptor, whatever `path()` names now), else a copy from the
  /// descriptor (fsynced). Returns whether it linked. Throws IoError naming both paths.
  bool link_or_copy(const std::string& target) const;
  /// Copies the byte ranges [first, second) into `target` (an existing file) at the same
  /// offsets and fsyncs it. Throws IoError naming both paths.
  void copy_ranges(const std::string& target,
                   const std::vector<std::pair<uint64_t, uint64_t>>& ranges) const;

  /// One reused chunk: bytes [begin, end) and the hash the save staged for them.
  struct Chunk {
    uint64_t begin = 0, end = 0, hash = 0;
  };
  /// Reads `chunks` back from `target` (the new snapshot's file, after link_or_copy or
  /// copy_ranges) and checks each hash. Throws Error(kHashMismatch) naming the base file and
  /// the chunk when the base changed between its proof and the link or copy.
  void check_reused(const std::string& target, const std::vector<Chunk>& chunks) const;
  /// Whether the opened file has not been written since it was opened: same size and
  /// modification time. A whole file linked from it then holds what was proven, without
  /// reading it back (its bytes are the base's own).
  bool unmodified_since_opened() const;

 private:
  void copy_ranges_to(int out, const std::string& target,
                      const std::vector<std::pair<uint64_t, uint64_t>>& ranges) const;
  // Hard-links the opened file (its descriptor) at `target`: whether it did.
  bool link_descriptor(const std::string& target) const;

  std::string path_;
  uint64_t size_ = 0;
  io::UniqueFd fd_;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  struct timespec mtime_ {};
};

}  // namespace tsnap::pipeline
