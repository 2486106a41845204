#include "tsnap/state_dict.h"

#include "tsnap/error.h"

namespace tsnap {
namespace {

void check_new_entry(const std::string& key, const at::Tensor& tensor) {
  if (key.empty()) {
    throw_error(ErrorCode::kInvalidArgument, "tsnap: StateDict key must not be empty");
  }
  if (!tensor.defined()) {
    throw_error(ErrorCode::kInvalidArgument,
                "tsnap: StateDict tensor for key '" + key + "' is undefined");
  }
}

[[noreturn]] void throw_key_not_found(const std::string& key) {
  throw_error(ErrorCode::kKeyNotFound, "tsnap: key '" + key + "' is not in the StateDict");
}

}  // namespace

StateDict::StateDict(std::initializer_list<std::pair<std::string, at::Tensor>> items) {
  for (const auto& [key, tensor] : items) insert(key, tensor);
}

StateEntry& StateDict::insert(std::string key, at::Tensor tensor,
                              std::optional<at::ScalarType> dtype, std::optional<ShardSpec> shard) {
  check_new_entry(key, tensor);
  if (map_.count(key) != 0) {
    throw_error(ErrorCode::kInvalidArgument, "tsnap: duplicate StateDict key '" + key + "'");
  }
  StateEntry entry{std::move(tensor), dtype, std::move(shard)};
  return map_.emplace(std::move(key), std::move(entry)).first->second;
}

StateEntry& StateDict::set(std::string key, at::Tensor tensor) {
  check_new_entry(key, tensor);
  // A replaced entry starts afresh: its old dtype and shard spec described the old tensor.
  StateEntry& entry = map_[std::move(key)];
  entry = StateEntry{std::move(tensor), std::nullopt, std::nullopt};
  return entry;
}

const at::Tensor& StateDict::at(const std::string& key) const { return entry(key).tensor; }

StateEntry& StateDict::entry(const std::string& key) {
  auto it = map_.find(key);
  if (it == map_.end()) throw_key_not_found(key);
  return it->second;
}

const StateEntry& StateDict::entry(const std::string& key) const {
  auto it = map_.find(key);
  if (it == map_.end()) throw_key_not_found(key);
  return it->second;
}

std::vector<std::string> StateDict::keys() const {
  std::vector<std::string> out;
  out.reserve(map_.size());
  for (const auto& kv : map_) out.push_back(kv.first);
  return out;
}

uint64_t StateDict::nbytes() const {
  uint64_t total = 0;
  for (const auto& kv : map_) total += kv.second.tensor.nbytes();
  return total;
}

}  // namespace tsnap
