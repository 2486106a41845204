#pragma once
// Reading one shard file of a committed snapshot chunk by chunk, checking it against the
// manifest: exact size (truncation), header agreement, and each chunk's XXH3-64.

#include <cstdint>
#include <filesystem>
#include <string>

#include "tsnap/manifest.h"

namespace tsnap::restore {

class ShardReader {
 public:
  /// Opens `<dir>/<file.name>` and checks its size and its safetensors header against `file`
  /// and the manifest's tensors. Errors: Error(kNotFound) for a missing file,
  /// FormatError(kTruncated) naming the sizes, FormatError(kBadManifest) for a header that
  /// disagrees with the manifest.
  ShardReader(const std::filesystem::path& dir, const FileRecord& file, const Manifest& manifest);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  /// Reads chunk `c` into `buf` (at least file.chunk_bytes long); returns its length.
  /// With `verify`, throws FormatError(kHashMismatch) naming file, chunk and offset.
  /// Thread-safe (pread).
  uint64_t read_chunk(uint64_t c, uint8_t* buf, bool verify) const;
  /// Whether chunk `c` (already read into `buf`, `len` bytes) has the recorded hash.
  bool chunk_ok(uint64_t c, const uint8_t* buf, uint64_t len) const;

  const FileRecord& file() const { return file_; }
  const std::string& path() const { return path_; }

 private:
  const FileRecord& file_;
  std::string path_;
  int fd_ = -1;
};

}  // namespace tsnap::restore
