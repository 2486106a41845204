#pragma once
// The keys of a snapshot as the tools show them: a key is stored whole (one record, written by
// one rank: replicated state in a distributed save) or as pieces of a global tensor (sharded
// state: one record per piece, each with its ShardSpec). Reading a key gives the whole tensor
// either way, without LibTorch: a key of one record as a view of the snapshot's mapping, a key
// of several pieces assembled from them (only the chunks under the wanted rows are read).

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "restore/mapped_snapshot.h"
#include "tsnap/manifest.h"

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
/// Every key name of `m`, once each, in name order.
std::vector<std::string> key_names(const Manifest& m);
/// Key `key` of `m`. Errors: InvalidArgument(kKeyNotFound) naming the key and `snapshot`.
KeyView key_view(const Manifest& m, const std::string& key, const std::filesystem::path& snapshot);

/// "0", "0-3", "0,2,5": a set of ranks (ascending) spelled shortly.
std::string ranks_string(const std::vector<int>& ranks);

/// A key's values as stored: dense, row-major, in the stored dtype; a view of the snapshot's
/// mapping (valid while the MappedSnapshot lives) or a buffer of its own.
struct Values {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  std::shared_ptr<const std::vector<uint8_t>> owned;
  int64_t numel() const;
  /// Element `i` (row-major) as a double: floating values as they are, integers converted,
  /// bool as 0 or 1.
  double real(int64_t i) const;
  /// Element `i` of an integer or bool dtype.
  int64_t integer(int64_t i) const;
  /// Bytes of elements [begin, begin + n).
  const uint8_t* at(int64_t begin) const { return data + begin * element_bytes(); }
  uint64_t element_bytes() const;
};

/// Key `key` of `snap`, whole or, with `rows`, rows [first, second) along dimension 0, in its
/// stored dtype; a key stored as several pieces is assembled. Errors: those of
/// MappedSnapshot::bytes and read_box; InvalidArgument for rows outside the tensor.
Values read_key(const restore::MappedSnapshot& snap, const KeyView& key,
                std::optional<std::pair<int64_t, int64_t>> rows = std::nullopt);

}  // namespace tsnap::cli
