#include "cli/keys.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "common/glob.h"
#include "format/dtype.h"
#include "tsnap/error.h"

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

std::vector<std::string> key_names(const Manifest& m) {
  std::vector<std::string> names;
  for (const KeyView& k : key_views(m)) names.push_back(k.name);
  return names;
}

KeyView key_view(const Manifest& m, const std::string& key, const std::filesystem::path& snapshot) {
  KeyView v{key, m.pieces(key)};
  if (v.pieces.empty()) {
    throw_error(ErrorCode::kKeyNotFound, "key '" + key + "' is not in snapshot " +
                                             snapshot.string() +
                                             detail::near_keys_note(key, key_names(m)));
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

int64_t Values::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint64_t Values::element_bytes() const { return format::element_size(dtype); }

namespace {

template <typename T>
T element(const uint8_t* data, int64_t i) {
  T v;
  std::memcpy(&v, data + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
}

}  // namespace

double Values::real(int64_t i) const {
  switch (dtype) {
    case at::kDouble:
      return element<double>(data, i);
    case at::kFloat:
      return element<float>(data, i);
    case at::kHalf:
      return static_cast<float>(element<c10::Half>(data, i));
    case at::kBFloat16:
      return static_cast<float>(element<c10::BFloat16>(data, i));
    default:
      return static_cast<double>(integer(i));
  }
}

int64_t Values::integer(int64_t i) const {
  switch (dtype) {
    case at::kLong:
      return element<int64_t>(data, i);
    case at::kInt:
      return element<int32_t>(data, i);
    case at::kShort:
      return element<int16_t>(data, i);
    case at::kChar:
      return element<int8_t>(data, i);
    case at::kByte:
      return element<uint8_t>(data, i);
    case at::kBool:
      return element<uint8_t>(data, i) != 0;
    default:
      return static_cast<int64_t>(real(i));
  }
}

Values read_key(const restore::MappedSnapshot& snap, const KeyView& key,
                std::optional<std::pair<int64_t, int64_t>> rows) {
  const TensorRecord& first = *key.pieces.front();
  std::vector<int64_t> shape = key.read_shape();
  if (rows) {
    if (shape.empty() || rows->first < 0 || rows->second < rows->first || rows->second > shape[0]) {
      throw_error(ErrorCode::kInvalidArgument,
                  "rows [" + std::to_string(rows->first) + ", " + std::to_string(rows->second) +
                      ") are outside tensor '" + key.name + "' of " + std::to_string(shape.size()) +
                      " dimensions" +
                      (shape.empty() ? "" : " and " + std::to_string(shape[0]) + " rows"));
    }
  }
  Values v{first.dtype, shape, nullptr, nullptr};
  if (key.pieces.size() == 1) {
    // As stored: a view of the rows asked for (only their chunks are verified).
    uint64_t begin = first.begin, end = first.end;
    if (rows) {
      const uint64_t row_bytes =
          shape[0] == 0 ? 0 : first.nbytes() / static_cast<uint64_t>(shape[0]);
      begin = first.begin + static_cast<uint64_t>(rows->first) * row_bytes;
      end = first.begin + static_cast<uint64_t>(rows->second) * row_bytes;
      v.shape[0] = rows->second - rows->first;
    }
    v.data = snap.bytes(first, begin, end);
    return v;
  }
  // Several pieces: the wanted box of the global tensor (rows along dimension 0, or all of
  // it), assembled from whichever pieces overlap it.
  restore::Box box{std::vector<int64_t>(shape.size(), 0), shape};
  if (rows) {
    box.offsets[0] = rows->first;
    box.shape[0] = rows->second - rows->first;
    v.shape[0] = box.shape[0];
  }
  auto buffer = std::make_shared<std::vector<uint8_t>>(static_cast<uint64_t>(v.numel()) *
                                                       format::element_size(first.dtype));
  snap.read_box(key.pieces, box, buffer->data());
  v.data = buffer->data();
  v.owned = std::move(buffer);
  return v;
}

}  // namespace tsnap::cli
