#pragma once
/// \file
/// `tsnap::StateDict`: the flat name -> tensor map that every save takes and every load returns.

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tsnap/export.h"

namespace tsnap {

/// Where a rank's local piece sits inside a global tensor (sharded state, distributed saves).
struct TSNAP_API ShardSpec {
  std::vector<int64_t> global_shape;  ///< Shape of the whole tensor across all ranks.
  std::vector<int64_t> offsets;       ///< Index of this piece's first element in each dimension.
  bool operator==(const ShardSpec& o) const {
    return global_shape == o.global_shape && offsets == o.offsets;
  }
};

/// One tensor of a state dict. The tensor is referenced, never copied, until a save stages it.
struct TSNAP_API StateEntry {
  at::Tensor tensor;
  /// The dtype to store it as; unset keeps the tensor's dtype (or takes `SaveOptions::dtype`).
  /// Integer and bool tensors are never converted, whatever is asked.
  std::optional<at::ScalarType> dtype;
  /// Set when `tensor` is one rank's piece of a larger tensor.
  std::optional<ShardSpec> shard;
};

/// An ordered (by key) map from names to tensors, as LibTorch's `named_parameters()` gives them.
/// Thread-safety: like a std::map; concurrent reads are fine, writes need external locking.
/// Ownership: holds tensor references (shared storage), not copies.
class TSNAP_API StateDict {
 public:
  using Map = std::map<std::string, StateEntry>;
  using iterator = Map::iterator;
  using const_iterator = Map::const_iterator;

  StateDict() = default;
  /// `StateDict sd{{"w", w}, {"b", b}}`; throws InvalidArgument on a duplicate key.
  StateDict(std::initializer_list<std::pair<std::string, at::Tensor>> items);

  /// Adds a tensor; throws InvalidArgument if `key` is empty, already present, or `tensor` is
  /// undefined.
  StateEntry& insert(std::string key, at::Tensor tensor, std::optional<at::ScalarType> dtype = {},
                     std::optional<ShardSpec> shard = {});
  /// Adds or replaces a tensor.
  StateEntry& set(std::string key, at::Tensor tensor);
  /// The tensor under `key`; throws InvalidArgument(kKeyNotFound) naming the key.
  const at::Tensor& at(const std::string& key) const;
  /// The entry under `key`; throws InvalidArgument(kKeyNotFound) naming the key.
  StateEntry& entry(const std::string& key);
  const StateEntry& entry(const std::string& key) const;
  bool contains(const std::string& key) const { return map_.count(key) != 0; }
  /// Removes `key`; returns whether it was there.
  bool erase(const std::string& key) { return map_.erase(key) != 0; }
  size_t size() const { return map_.size(); }
  bool empty() const { return map_.empty(); }
  /// All keys, in order.
  std::vector<std::string> keys() const;
  /// Sum of the tensors' byte sizes in their current dtype.
  uint64_t nbytes() const;

  iterator begin() { return map_.begin(); }
  iterator end() { return map_.end(); }
  const_iterator begin() const { return map_.begin(); }
  const_iterator end() const { return map_.end(); }

 private:
  Map map_;
};

}  // namespace tsnap
