#pragma once
// The keys of a snapshot as the tools show them: a key is stored whole (one record, written by
// one rank: replicated state in a distributed save) or as pieces of a global tensor (sharded
// state: one record per piece, each with its ShardSpec). Reading a key gives the whole tensor
// either way: a key of one record through the lazy reader (a view of the mapping), a key of
// several pieces assembled by tsnap::load_into (only the chunks under the wanted rows).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tsnap/manifest.h"
#include "tsnap/reader.h"

namespace tsnap::cli {

/// One key of a manifest and its records.
struct KeyView {
  std::string name;
  std::vector<const TensorRecord*> pieces;  ///< its records, in offset order (at least one)
  /// Whether it is stored as a piece or pieces of a global tensor (records with a ShardSpec).
  bool sharded() const { return pieces.front()->shard.has_value(); }
  /// The global shape (of the whole tensor, not of a piece).
  const std::vector<int64_t>& shape() const;
  /// The shape read_key gives: the global shape, except for a key stored as one piece, which
  /// comes back as stored (a process's piece of a sharded save without its peers).
  const std::vector<int64_t>& read_shape() const;
  /// Elements of read_shape().
  int64_t numel() const;
  /// Stored bytes of all its records.
  uint64_t bytes() const;
  /// The ranks that wrote its records, ascending, without repeats.
  std::vector<int> ranks(const Manifest& m) const;
  /// "whole" (world size 1), "replicated" (a distributed save's key of one record) or
  /// "sharded" (stored as pieces).
  std::string kind(const Manifest& m) const;
};

/// Every key of `m`, in name order; pointers into `m`, which must outlive them.
std::vector<KeyView> key_views(const Manifest& m);
/// Key `key` of `m`. Errors: InvalidArgument(kKeyNotFound) naming the key and `snapshot`.
KeyView key_view(const Manifest& m, const std::string& key, const std::filesystem::path& snapshot);

/// "0", "0-3", "0,2,5": a set of ranks (ascending) spelled shortly.
std::string ranks_string(const std::vector<int>& ranks);

/// Key `key` of the snapshot `snapshot` that `reader` reads, whole or, with `rows`, rows
/// [first, second) along dimension 0, in its stored dtype; a key stored as several pieces is
/// assembled. Errors: those of SnapshotReader::read and read_rows, and of tsnap::load_into.
at::Tensor read_key(const SnapshotReader& reader, const std::filesystem::path& snapshot,
                    const KeyView& key, bool verify,
                    std::optional<std::pair<int64_t, int64_t>> rows = std::nullopt);

}  // namespace tsnap::cli
