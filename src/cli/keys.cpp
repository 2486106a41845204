#include "cli/keys.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <set>

#include "common/glob.h"
#include "tsnap/error.h"
#include "tsnap/load.h"

namespace tsnap::cli {

const std::vector<int64_t>& KeyView::shape() const {
  const TensorRecord& first = *pieces.front();
  return first.shard ? first.shard->global_shape : first.shape;
}

const std::vector<int64_t>& KeyView::read_shape() const {
  return pieces.size() == 1 ? pieces.front()->shape : shape();
}

int64_t KeyView::numel() const {
  int64_t n = 1;
  for (int64_t d : read_shape()) n *= d;
  return n;
}

uint64_t KeyView::bytes() const {
  uint64_t total = 0;
  for (const TensorRecord* r : pieces) total += r->nbytes();
  return total;
}

std::vector<int> KeyView::ranks(const Manifest& m) const {
  std::set<int> out;
  for (const TensorRecord* r : pieces) {
    const FileRecord* f = m.find_file(r->file);
    out.insert(f ? f->rank : 0);
  }
  return {out.begin(), out.end()};
}

std::string KeyView::kind(const Manifest& m) const {
  if (sharded()) return "sharded";
  return m.world_size > 1 ? "replicated" : "whole";
}

std::vector<KeyView> key_views(const Manifest& m) {
  std::vector<KeyView> out;
  for (const TensorRecord& t : m.tensors) {  // sorted by name, pieces of a key together
    if (out.empty() || out.back().name != t.name) out.push_back({t.name, {}});
    out.back().pieces.push_back(&t);
  }
  return out;
}

KeyView key_view(const Manifest& m, const std::string& key, const std::filesystem::path& snapshot) {
  KeyView v{key, m.pieces(key)};
  if (v.pieces.empty()) {
    std::vector<std::string> names;
    for (const KeyView& k : key_views(m)) names.push_back(k.name);
    throw_error(ErrorCode::kKeyNotFound, "key '" + key + "' is not in snapshot " +
                                             snapshot.string() +
                                             detail::near_keys_note(key, names));
  }
  return v;
}

std::string ranks_string(const std::vector<int>& ranks) {
  if (ranks.empty()) return "-";
  const bool run = ranks.back() - ranks.front() + 1 == static_cast<int>(ranks.size());
  if (run && ranks.size() > 2) {
    return std::to_string(ranks.front()) + "-" + std::to_string(ranks.back());
  }
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out;
}

at::Tensor read_key(const SnapshotReader& reader, const std::filesystem::path& snapshot,
                    const KeyView& key, bool verify,
                    std::optional<std::pair<int64_t, int64_t>> rows) {
  if (key.pieces.size() == 1) {
    return rows ? reader.read_rows(key.name, rows->first, rows->second - rows->first)
                : reader.read(key.name);
  }
  // Several pieces: the wanted box of the global tensor (rows along dimension 0, or all of
  // it), read from whichever pieces overlap it.
  std::vector<int64_t> shape = key.shape();
  std::optional<ShardSpec> box;
  if (rows) {
    if (shape.empty() || rows->first < 0 || rows->second < rows->first || rows->second > shape[0]) {
      throw_error(ErrorCode::kInvalidArgument,
                  "rows [" + std::to_string(rows->first) + ", " + std::to_string(rows->second) +
                      ") are outside tensor '" + key.name + "' of " + std::to_string(shape.size()) +
                      " dimensions" +
                      (shape.empty() ? "" : " and " + std::to_string(shape[0]) + " rows"));
    }
    box = ShardSpec{shape, std::vector<int64_t>(shape.size(), 0)};
    box->offsets[0] = rows->first;
    shape[0] = rows->second - rows->first;
  }
  StateDict dest;
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(key.pieces.front()->dtype));
  dest.insert(key.name, t, {}, box);
  LoadOptions options;
  options.verify = verify;
  load_into(snapshot, dest, options);
  return t;
}

}  // namespace tsnap::cli
