#pragma once
/// \file
/// `tsnap::load` and `tsnap::verify`: reading snapshots back.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "tsnap/manifest.h"
#include "tsnap/state_dict.h"

namespace tsnap {

/// Options of a load.
struct LoadOptions {
  bool verify = true;                 ///< Check every chunk's XXH3-64 (on by default).
  std::vector<std::string> include;   ///< Glob patterns of keys to load (empty = all).
  std::vector<std::string> exclude;   ///< Glob patterns of keys to skip; not with include.
};

/// Loads a snapshot into new CPU tensors in their stored dtype, bit-identical to what was
/// saved. Errors: Error(kNotFound), FormatError (kTruncated, kHashMismatch naming file and
/// chunk, ...), InvalidArgument for bad patterns. Thread-safe.
StateDict load(const std::filesystem::path& path, const LoadOptions& options = {});

/// One chunk that failed verification.
struct BadChunk {
  std::string file;
  uint64_t chunk = 0;       ///< Chunk index in the file.
  uint64_t offset = 0;      ///< Its byte offset.
  std::string problem;      ///< "hash mismatch", "truncated", "missing file", ...
};

/// Re-hashes every chunk of every shard. Returns the bad ones (empty = intact).
/// Errors: those of read_manifest (a snapshot without a valid manifest cannot be verified).
std::vector<BadChunk> verify(const std::filesystem::path& path);

}  // namespace tsnap
