// Manifest text -> Manifest: parse_manifest and the reader's checks of docs/format.md
// (sections 4 and 6).

#include <algorithm>
#include <climits>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "common/shape.h"
#include "format/dtype.h"
#include "format/hash.h"
#include "format/json_bounds.h"
#include "format/layout.h"
#include "format/manifest_internal.h"
#include "format/manifest_io.h"
#include "format/safetensors.h"
#include "tsnap/error.h"

namespace tsnap::format {
namespace {

using nlohmann::json;

/// Typed, checked access to the manifest JSON; every failure names the manifest (`label`).
class Checker {
 public:
  explicit Checker(const std::string& label) : label_(label) {}

  [[noreturn]] void fail(ErrorCode code, const std::string& problem) const {
    throw_error(code, "" + label_ + ": " + problem);
  }

  /// `obj[key]`, which must exist and have `type` (an unsigned integer also passes as integer).
  const json& field(const json& obj, const char* key, json::value_t type,
                    const std::string& where) const {
    auto it = obj.find(key);
    if (it == obj.end()) fail(ErrorCode::kBadManifest, where + " has no \"" + key + "\"");
    const bool ok = it->type() == type || (type == json::value_t::number_integer &&
                                           it->type() == json::value_t::number_unsigned);
    if (!ok) {
      fail(ErrorCode::kBadManifest, where + ": \"" + key + "\" is " + it->type_name() +
                                        ", expected " + json(type).type_name());
    }
    return *it;
  }

  std::string str(const json& obj, const char* key, const std::string& where) const {
    return field(obj, key, json::value_t::string, where).get<std::string>();
  }

  /// A non-negative integer no larger than `max`; `what()` names it in errors (built only on
  /// failure).
  template <class What>
  uint64_t uint(const json& v, uint64_t max, What what) const {
    if (!v.is_number_unsigned() || v.get<uint64_t>() > max) {
      fail(ErrorCode::kBadManifest,
           what() + " must be an integer in [0, " + std::to_string(max) + "]");
    }
    return v.get<uint64_t>();
  }

  uint64_t uint(const json& obj, const char* key, const std::string& where,
                uint64_t max = UINT64_MAX) const {
    return uint(field(obj, key, json::value_t::number_integer, where), max,
                [&] { return where + " \"" + key + "\""; });
  }

  int64_t int64(const json& obj, const char* key, const std::string& where) const {
    const json& v = field(obj, key, json::value_t::number_integer, where);
    if (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX) {
      fail(ErrorCode::kBadManifest, where + " \"" + key + "\" does not fit int64");
    }
    return v.get<int64_t>();
  }

  /// An array of dimensions (non-negative, fitting int64).
  std::vector<int64_t> dims(const json& obj, const char* key, const std::string& where) const {
    const json& a = field(obj, key, json::value_t::array, where);
    if (a.size() > kMaxDims) {
      fail(ErrorCode::kBadManifest, where + ": \"" + key + "\" has " + std::to_string(a.size()) +
                                        " dimensions, more than " + std::to_string(kMaxDims));
    }
    std::vector<int64_t> out;
    out.reserve(a.size());
    for (const auto& d : a) {
      const size_t i = out.size();
      out.push_back(static_cast<int64_t>(uint(
          d, INT64_MAX, [&] { return where + " \"" + key + "\"[" + std::to_string(i) + "]"; })));
    }
    return out;
  }

  at::ScalarType dtype(const json& obj, const char* key, const std::string& where) const {
    const std::string name = str(obj, key, where);
    if (auto t = find_dtype(name)) return *t;
    fail(ErrorCode::kBadManifest, where + ": unknown " + key + " \"" + printable(name) + "\"");
  }

 private:
  const std::string& label_;
};

/// A file name must be one plain path component, so it stays inside the snapshot directory.
void check_file_name(const Checker& c, const std::string& name) {
  const bool unsafe = name.empty() || name == "." || name == ".." ||
                      name.find_first_of(std::string("/\\\0", 3)) != std::string::npos;
  if (unsafe) {
    c.fail(ErrorCode::kUnsafePath, "file name \"" + printable(name) +
                                       "\" is not a plain name inside the snapshot directory");
  }
}

FileRecord parse_file(const Checker& c, const std::string& name, const json& j,
                      uint64_t world_size) {
  check_file_name(c, name);
  const std::string where = "file '" + printable(name) + "'";
  if (!j.is_object()) c.fail(ErrorCode::kBadManifest, where + " is not an object");
  FileRecord f;
  f.name = name;
  f.size = c.uint(j, "size", where);
  f.data_offset = c.uint(j, "data_offset", where);
  f.chunk_bytes = c.uint(j, "chunk_bytes", where);
  if (j.contains("rank")) f.rank = static_cast<int>(c.uint(j, "rank", where, world_size - 1));
  if (j.contains("tsnap_id")) {
    f.tsnap_id = c.str(j, "tsnap_id", where);
    if (f.tsnap_id.empty()) c.fail(ErrorCode::kBadManifest, where + ": \"tsnap_id\" is empty");
  }
  if (j.contains("reused_from")) f.reused_from = c.str(j, "reused_from", where);
  if (f.data_offset == 0 || f.data_offset % kAlignment != 0 || f.data_offset > f.size) {
    c.fail(ErrorCode::kBadManifest, where + ": data_offset " + std::to_string(f.data_offset) +
                                        " is not a positive multiple of " +
                                        std::to_string(kAlignment) + " within its " +
                                        std::to_string(f.size) + " bytes");
  }
  if (f.chunk_bytes == 0 || f.chunk_bytes % kAlignment != 0 || f.chunk_bytes > kMaxChunkBytes) {
    c.fail(ErrorCode::kBadManifest, where + ": chunk_bytes " + std::to_string(f.chunk_bytes) +
                                        " is not a positive multiple of " +
                                        std::to_string(kAlignment) + " up to " +
                                        std::to_string(kMaxChunkBytes));
  }
  const json& hashes = c.field(j, "chunk_hashes", json::value_t::array, where);
  const uint64_t chunks = f.size / f.chunk_bytes + (f.size % f.chunk_bytes != 0 ? 1 : 0);
  if (hashes.size() != chunks) {
    c.fail(ErrorCode::kBadManifest, where + " has " + std::to_string(hashes.size()) +
                                        " chunk hashes, expected " + std::to_string(chunks) + " (" +
                                        std::to_string(f.size) + " bytes in chunks of " +
                                        std::to_string(f.chunk_bytes) + ")");
  }
  f.chunk_hashes.reserve(hashes.size());
  for (const auto& h : hashes) {
    const bool ok =
        h.is_string() && h.get_ref<const std::string&>().size() == 16 &&
        h.get_ref<const std::string&>().find_first_not_of("0123456789abcdef") == std::string::npos;
    if (!ok) {
      c.fail(ErrorCode::kBadManifest, where + ": chunk hash " +
                                          std::to_string(f.chunk_hashes.size()) +
                                          " is not 16 lowercase hex digits");
    }
    f.chunk_hashes.push_back(std::stoull(h.get<std::string>(), nullptr, 16));
  }
  return f;
}

ShardSpec parse_shard(const Checker& c, const json& j, const std::vector<int64_t>& shape,
                      const std::string& where) {
  if (!j.is_object()) c.fail(ErrorCode::kBadManifest, where + ": \"shard\" is not an object");
  ShardSpec s;
  s.global_shape = c.dims(j, "global_shape", where + " shard");
  s.offsets = c.dims(j, "offsets", where + " shard");
  bool ok = s.global_shape.size() == shape.size() && s.offsets.size() == shape.size();
  for (size_t i = 0; ok && i < shape.size(); ++i) {
    int64_t last = 0;
    ok = !__builtin_add_overflow(s.offsets[i], shape[i], &last) && last <= s.global_shape[i];
  }
  if (!ok) {
    c.fail(ErrorCode::kBadManifest, where + ": the shard does not lie inside its global shape");
  }
  return s;
}

TensorRecord parse_tensor(const Checker& c, const std::string& name, const json& j,
                          const std::map<std::string, const FileRecord*>& files) {
  const std::string where = "tensor '" + printable(name) + "'";
  if (name.empty()) c.fail(ErrorCode::kBadManifest, "a tensor has an empty name");
  if (!j.is_object()) c.fail(ErrorCode::kBadManifest, where + " is not an object");
  TensorRecord t;
  t.name = name;
  t.file = c.str(j, "file", where);
  auto file = files.find(t.file);
  if (file == files.end()) {
    c.fail(ErrorCode::kBadManifest,
           where + " is in file '" + printable(t.file) + "', which \"files\" does not list");
  }
  const FileRecord& f = *file->second;
  t.dtype = c.dtype(j, "dtype", where);
  t.source_dtype = c.dtype(j, "source_dtype", where);
  if (t.dtype != t.source_dtype && !(is_floating(t.dtype) && is_floating(t.source_dtype))) {
    c.fail(ErrorCode::kBadManifest, where + ": only floating dtypes are converted, but " +
                                        std::string(dtype_name(t.source_dtype)) +
                                        " was stored as " + std::string(dtype_name(t.dtype)));
  }
  t.shape = c.dims(j, "shape", where);
  const json& offsets = c.field(j, "offsets", json::value_t::array, where);
  if (offsets.size() != 2) c.fail(ErrorCode::kBadManifest, where + ": \"offsets\" needs 2 values");
  t.begin = c.uint(offsets[0], UINT64_MAX, [&] { return where + " offsets[0]"; });
  t.end = c.uint(offsets[1], UINT64_MAX, [&] { return where + " offsets[1]"; });
  const std::string range = "[" + std::to_string(t.begin) + ", " + std::to_string(t.end) + ")";
  if (t.begin > t.end || t.begin < f.data_offset || t.end > f.size) {
    c.fail(ErrorCode::kBadOffsets, where + ": offsets " + range + " lie outside the data [" +
                                       std::to_string(f.data_offset) + ", " +
                                       std::to_string(f.size) + ") of '" + printable(f.name) + "'");
  }
  const std::optional<uint64_t> nbytes = checked_nbytes(t.dtype, t.shape);
  if (!nbytes) c.fail(ErrorCode::kBadOffsets, where + ": the byte size of its shape overflows");
  if (*nbytes != t.nbytes()) {
    c.fail(ErrorCode::kBadOffsets, where + ": its dtype and shape need " + std::to_string(*nbytes) +
                                       " bytes but offsets " + range + " hold " +
                                       std::to_string(t.nbytes()));
  }
  if (auto it = j.find("shard"); it != j.end()) t.shard = parse_shard(c, *it, t.shape, where);
  return t;
}

/// No two tensors of one file share a byte.
void check_overlaps(const Checker& c, const std::vector<TensorRecord>& tensors) {
  std::vector<const TensorRecord*> order;
  order.reserve(tensors.size());
  for (const auto& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorRecord* a, const TensorRecord* b) {
    return std::tie(a->file, a->begin, a->end) < std::tie(b->file, b->begin, b->end);
  });
  for (size_t i = 1; i < order.size(); ++i) {
    const TensorRecord& a = *order[i - 1];
    const TensorRecord& b = *order[i];
    if (a.file == b.file && b.begin < a.end) {
      c.fail(ErrorCode::kBadOffsets, "tensors '" + printable(a.name) + "' and '" +
                                         printable(b.name) + "' overlap in '" + printable(a.file) +
                                         "'");
    }
  }
}

/// weight_map maps exactly the tensors' names to their files.
void check_weight_map(const Checker& c, const json& map, const json& jtensors,
                      const std::vector<TensorRecord>& tensors,
                      const std::set<std::string>& pieced) {
  for (const auto& t : tensors) {
    if (pieced.count(t.name) != 0) {
      if (map.contains(t.name)) {
        c.fail(ErrorCode::kBadManifest, "weight_map names '" + printable(t.name) +
                                            "', which is stored as pieces in several files");
      }
      continue;
    }
    auto it = map.find(t.name);
    if (it == map.end() || !it->is_string() || it->get_ref<const std::string&>() != t.file) {
      c.fail(ErrorCode::kBadManifest, "weight_map does not map tensor '" + printable(t.name) +
                                          "' to '" + printable(t.file) + "'");
    }
  }
  for (const auto& [key, value] : map.items()) {
    if (!jtensors.contains(key)) {
      c.fail(ErrorCode::kBadManifest,
             "weight_map names '" + printable(key) + "', which is not a tensor");
    }
  }
}

/// The pieces of one key fit together: the same global shape and stored dtype, and no two
/// share an element. (They need not cover the whole tensor.)
void check_pieces(const Checker& c, const std::vector<TensorRecord>& pieces) {
  const TensorRecord& first = pieces.front();
  const std::string where = "tensor '" + printable(first.name) + "'";
  for (const TensorRecord& p : pieces) {
    if (!p.shard) c.fail(ErrorCode::kBadManifest, where + ": a piece has no \"shard\"");
    if (p.shard->global_shape != first.shard->global_shape || p.dtype != first.dtype ||
        p.source_dtype != first.source_dtype) {
      c.fail(ErrorCode::kBadManifest,
             where + ": its pieces disagree on the global shape or the dtype");
    }
  }
  // Sweep along dimension 0: only pieces whose rows overlap are compared element-wise.
  std::vector<const TensorRecord*> order;
  order.reserve(pieces.size());
  for (const TensorRecord& p : pieces) order.push_back(&p);
  std::sort(order.begin(), order.end(), shard_before);
  const size_t dims = first.shape.size();
  for (size_t i = 0; i < order.size(); ++i) {
    const TensorRecord& a = *order[i];
    bool a_empty = false;
    for (int64_t d : a.shape) a_empty |= d == 0;
    if (a_empty) continue;
    for (size_t j = i + 1; j < order.size(); ++j) {
      const TensorRecord& b = *order[j];
      if (dims > 0 && b.shard->offsets[0] >= a.shard->offsets[0] + a.shape[0]) break;
      bool overlap = true;
      for (size_t d = 0; overlap && d < dims; ++d) {
        overlap = a.shard->offsets[d] < b.shard->offsets[d] + b.shape[d] &&
                  b.shard->offsets[d] < a.shard->offsets[d] + a.shape[d];
      }
      if (overlap) {
        c.fail(ErrorCode::kBadOffsets,
               where + ": two of its pieces (at offsets " + detail::shape_string(a.shard->offsets) +
                   " and " + detail::shape_string(b.shard->offsets) + ") share elements");
      }
    }
  }
}

// The name of the manifest's last member when its value has the shape of a checksum
// ("xxh3-64:<16 hex digits>", as tsnap writes it last), else nullopt.
std::optional<std::string> checksum_shaped_last_member(std::string_view text) {
  const size_t close = text.find_last_not_of(" \t\r\n");
  const size_t digits = 16, prefix = std::char_traits<char>::length(kChecksumPrefix);
  if (close == std::string_view::npos || text[close] != '}' || close < digits + prefix + 2) {
    return std::nullopt;
  }
  const size_t value = close - 1 - digits - prefix;  // the value's first character
  if (text[close - 1] != '"' || text.substr(value, prefix) != kChecksumPrefix ||
      text[value - 1] != '"' || text[value - 2] != ':' || text[value - 3] != '"') {
    return std::nullopt;
  }
  const size_t open = text.rfind('"', value - 4);
  if (open == std::string_view::npos) return std::nullopt;
  return std::string(text.substr(open + 1, value - 4 - open));
}

// Checks the manifest's own checksum. Version 3 on must have one; older writers' manifests
// may lack it, unless their last member has the checksum's shape under another name (a key
// edited to turn the check off).
void check_checksum(const Checker& c, std::string_view text, const json& root, int64_t version) {
  const auto it = root.find("checksum");
  if (it == root.end()) {
    if (version >= 3) {
      c.fail(ErrorCode::kBadManifest, "format version " + std::to_string(version) +
                                          " requires the manifest's \"checksum\", which it lacks");
    }
    if (auto name = checksum_shaped_last_member(text)) {
      c.fail(ErrorCode::kBadManifest, "its last member \"" + printable(*name, 40) +
                                          "\" has the shape of its checksum but not the name "
                                          "\"checksum\": the manifest was edited");
    }
    return;
  }
  const std::string recorded = it->is_string() ? it->get<std::string>() : std::string();
  const size_t prefix = std::char_traits<char>::length(kChecksumPrefix);
  if (recorded.size() != prefix + 16 || recorded.compare(0, prefix, kChecksumPrefix) != 0) {
    c.fail(ErrorCode::kBadManifest,
           "\"checksum\" is not \"" + std::string(kChecksumPrefix) + "<16 hex digits>\"");
  }
  const size_t at = text.rfind(kChecksumMember);
  if (at == std::string_view::npos) {
    c.fail(ErrorCode::kBadManifest, "\"checksum\" is not the last member, where tsnap writes it");
  }
  const std::string actual = std::string(kChecksumPrefix) + hex16(hash64(text.data(), at));
  if (actual != recorded) {
    c.fail(ErrorCode::kBadManifest, "its content does not match its checksum (" + actual +
                                        ", recorded " + printable(recorded) +
                                        "): the manifest changed after it was written");
  }
}

// The "unchanged" member (version 3): the snapshot compared with, and keys of "tensors".
void parse_unchanged(const Checker& c, const json& j, const json& jtensors, Manifest& m) {
  const std::string where = "\"unchanged\"";
  if (!j.is_object()) c.fail(ErrorCode::kBadManifest, where + " is not an object");
  m.unchanged_since = c.str(j, "since", where);
  if (m.unchanged_since.empty()) c.fail(ErrorCode::kBadManifest, where + ": \"since\" is empty");
  const json& keys = c.field(j, "keys", json::value_t::array, where);
  m.unchanged.reserve(keys.size());
  for (const json& k : keys) {
    if (!k.is_string() || !jtensors.contains(k.get_ref<const std::string&>())) {
      c.fail(ErrorCode::kBadManifest,
             where + " names " + printable(k.dump()) + ", which is not a tensor");
    }
    m.unchanged.push_back(k.get<std::string>());
  }
}

// `created` is an ISO 8601 UTC time, "YYYY-MM-DDTHH:MM:SS[.fraction]Z", of the same second as
// `created_unix_ns`: a manifest whose two times disagree was not written by tsnap's writer.
void check_created(const Checker& c, const std::string& created, int64_t unix_ns) {
  const std::optional<int64_t> seconds = parse_utc_timestamp(created);
  if (!seconds) {
    c.fail(ErrorCode::kBadManifest, "\"created\" is \"" + printable(created) +
                                        "\", not an ISO 8601 UTC time (YYYY-MM-DDTHH:MM:SSZ)");
  }
  if (unix_ns < 0 || *seconds != unix_ns / 1000000000) {
    c.fail(ErrorCode::kBadManifest, "\"created\" (" + created + ") and \"created_unix_ns\" (" +
                                        std::to_string(unix_ns) + ") name different times");
  }
}

}  // namespace

Manifest parse_manifest(std::string_view text, const std::string& label) {
  const Checker c(label);
  json root;
  try {
    root = parse_bounded_json(text);
  } catch (const json::exception& e) {
    c.fail(ErrorCode::kBadManifest, "not valid JSON: " + printable(e.what(), 200));
  } catch (const std::invalid_argument& e) {
    c.fail(ErrorCode::kBadManifest, std::string("not bounded JSON: ") + e.what());
  }
  if (!root.is_object()) c.fail(ErrorCode::kBadManifest, "not a JSON object");

  // The format and its version come first: a newer version may change every other field.
  const std::string where = "manifest";
  const std::string format = c.str(root, "format", where);
  if (format != kFormatName) {
    c.fail(ErrorCode::kUnsupportedFormat,
           "format is \"" + printable(format) + "\", not \"" + kFormatName + "\"");
  }
  const int64_t version = c.int64(root, "format_version", where);
  if (version > kFormatVersion) {
    c.fail(ErrorCode::kUnsupportedFormat, "written in format version " + std::to_string(version) +
                                              "; this tsnap reads format versions up to " +
                                              std::to_string(kFormatVersion));
  }
  if (version < 1) {
    c.fail(ErrorCode::kBadManifest, "format_version " + std::to_string(version) + " is not valid");
  }
  check_checksum(c, text, root, version);  // after the version: a newer one may checksum otherwise

  Manifest m;
  m.format_version = static_cast<int>(version);
  m.id = c.str(root, "id", where);
  if (m.id.empty()) c.fail(ErrorCode::kBadManifest, "\"id\" is empty");
  m.tsnap_version = c.str(root, "tsnap_version", where);
  m.torch_version = c.str(root, "torch_version", where);
  m.created = c.str(root, "created", where);
  m.created_unix_ns = c.int64(root, "created_unix_ns", where);
  check_created(c, m.created, m.created_unix_ns);
  m.world_size = static_cast<int>(c.uint(root, "world_size", where, INT_MAX));
  if (m.world_size < 1) c.fail(ErrorCode::kBadManifest, "\"world_size\" must be at least 1");
  c.field(root, "metadata", json::value_t::object, where);
  m.metadata = std::move(root["metadata"]);  // moved: user metadata may be large
  if (root.contains("step")) m.step = c.int64(root, "step", where);

  std::map<std::string, const FileRecord*> files;
  const json& jfiles = c.field(root, "files", json::value_t::object, where);
  m.files.reserve(jfiles.size());  // No reallocation below: `files` points into m.files.
  for (const auto& [name, j] : jfiles.items()) {
    m.files.push_back(parse_file(c, name, j, static_cast<uint64_t>(m.world_size)));
    files.emplace(name, &m.files.back());
  }
  const json& jtensors = c.field(root, "tensors", json::value_t::object, where);
  m.tensors.reserve(jtensors.size());
  std::set<std::string> pieced;  // keys stored as pieces: not in weight_map
  for (const auto& [name, j] : jtensors.items()) {
    const auto pieces = j.is_object() ? j.find("pieces") : j.end();
    if (!j.is_object() || pieces == j.end()) {
      m.tensors.push_back(parse_tensor(c, name, j, files));
      continue;
    }
    const std::string where = "tensor '" + printable(name) + "'";
    if (!pieces->is_array() || pieces->empty() || j.size() != 1) {
      c.fail(ErrorCode::kBadManifest,
             where + ": \"pieces\" must be a non-empty array and its only field");
    }
    std::vector<TensorRecord> records;
    records.reserve(pieces->size());
    for (const json& p : *pieces) records.push_back(parse_tensor(c, name, p, files));
    check_pieces(c, records);
    std::sort(records.begin(), records.end(),
              [](const TensorRecord& a, const TensorRecord& b) { return shard_before(&a, &b); });
    for (TensorRecord& r : records) m.tensors.push_back(std::move(r));
    pieced.insert(name);
  }
  if (root.contains("unchanged")) parse_unchanged(c, root["unchanged"], jtensors, m);
  check_overlaps(c, m.tensors);
  check_weight_map(c, c.field(root, "weight_map", json::value_t::object, where), jtensors,
                   m.tensors, pieced);
  return m;
}

}  // namespace tsnap::format
