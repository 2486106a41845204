#pragma once
/// \file
/// `tsnap::open`: a lazy, memory-mapped reader of one snapshot, for inspection and tools.
/// Nothing is read until a tensor is asked for; then only its pages are touched, and (with
/// verification on) the chunks that hold them are hashed, once per reader.
///
/// ```
/// tsnap::SnapshotReader r = tsnap::open("ckpt/step-1000");
/// for (const std::string& key : r.keys()) std::cout << key << '\n';
/// at::Tensor emb = r.read("model.wte.weight");            // zero-copy view of the mapping
/// at::Tensor rows = r.read_rows("model.wte.weight", 0, 8);  // rows [0, 8) along dim 0
/// ```

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tsnap/export.h"
#include "tsnap/manifest.h"

namespace tsnap {

/// Options of `tsnap::open`.
struct TSNAP_API OpenOptions {
  /// Check the XXH3-64 of every chunk a read touches (each chunk once per reader).
  bool verify = true;
};

/// A lazy reader of one snapshot. Shards are opened, checked (size, header) and mapped on the
/// first read that needs them.
/// Thread-safety: every method is const and may be called from any thread.
/// Ownership: a cheap handle (copies share one state). Tensors it returns share memory with a
/// private (copy-on-write) mapping of the shard file: writing to them never changes the file,
/// and they keep the mapping alive after the reader is gone. The shard files must not be
/// truncated while mapped (reading a page past the end of a file raises SIGBUS).
class TSNAP_API SnapshotReader {
 public:
  /// The snapshot's manifest.
  const Manifest& manifest() const;
  /// Every tensor name, in order.
  std::vector<std::string> keys() const;
  bool contains(const std::string& key) const;
  /// The record of `key`. Errors: InvalidArgument(kKeyNotFound) naming the key.
  const TensorRecord& record(const std::string& key) const;

  /// Tensor `key` in its stored dtype and shape (a CPU view of the mapping; call `.clone()`
  /// for an independent copy, `.to(dtype)` to convert).
  /// Errors: InvalidArgument(kKeyNotFound); IoError(kNotFound) for a missing shard;
  /// FormatError(kTruncated, kBadManifest) for a shard that disagrees with the manifest;
  /// FormatError(kHashMismatch) naming file and chunk when verification is on.
  at::Tensor read(const std::string& key) const;
  /// Rows [start, start + length) of tensor `key` along dimension 0 (what `narrow(0, start,
  /// length)` gives); only the chunks under those rows are touched and verified. Slicing is
  /// along dimension 0 only: narrow the result for other dimensions.
  /// Errors: those of `read`; InvalidArgument for a 0-d tensor or rows outside [0, size(0)].
  at::Tensor read_rows(const std::string& key, int64_t start, int64_t length) const;

 private:
  struct Impl;
  friend TSNAP_API SnapshotReader open(const std::filesystem::path& path,
                                       const OpenOptions& options);
  explicit SnapshotReader(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  at::Tensor view(const TensorRecord& r, uint64_t begin, uint64_t end,
                  std::vector<int64_t> shape) const;
  std::shared_ptr<const Impl> impl_;
};

/// Opens the snapshot directory `path`: reads and validates its manifest (shards are opened on
/// demand). Errors: those of read_manifest (IoError(kNotFound), FormatError(kUnsupportedFormat)
/// for a newer format version, ...). Thread-safe.
TSNAP_API SnapshotReader open(const std::filesystem::path& path, const OpenOptions& options = {});

}  // namespace tsnap
