#include "format/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "common/shape.h"
#include "format/dtype.h"
#include "format/json_bounds.h"
#include "format/json_writer.h"
#include "format/open_file.h"
#include "io/fd.h"
#include "tsnap/error.h"

namespace tsnap::format {
namespace {

using nlohmann::json;

constexpr const char* kMetadataKey = "__metadata__";

using detail::shape_string;

std::string range_string(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

[[noreturn]] void fail(ErrorCode code, const std::string& file, const std::string& problem) {
  throw_error(code, "" + file + ": " + problem);
}

/// Reads one non-negative integer of a header (a dimension or an offset); `what()` names it in
/// errors (built only on failure: a hostile header may hold millions of dimensions).
template <class What>
uint64_t get_uint(const std::string& file, const json& v, uint64_t max, What what) {
  if (v.is_number_unsigned()) {
    const uint64_t x = v.get<uint64_t>();
    if (x <= max) return x;
    fail(ErrorCode::kBadHeader, file,
         what() + " is " + std::to_string(x) + ", larger than " + std::to_string(max));
  }
  if (v.is_number_integer()) {
    fail(ErrorCode::kBadHeader, file,
         what() + " is negative (" + std::to_string(v.get<int64_t>()) + ")");
  }
  fail(ErrorCode::kBadHeader, file, what() + " is not an integer but " + v.type_name());
}

const json& get_field(const std::string& file, const std::string& where, const json& obj,
                      const char* key, json::value_t type) {
  auto it = obj.find(key);
  if (it == obj.end()) fail(ErrorCode::kBadHeader, file, where + " has no \"" + key + "\"");
  if (it->type() != type) {
    fail(
        ErrorCode::kBadHeader, file,
        where + ": \"" + key + "\" is " + it->type_name() + ", expected " + json(type).type_name());
  }
  return *it;
}

HeaderTensor parse_tensor(const std::string& file, const std::string& name, const json& entry,
                          uint64_t data_len) {
  const std::string where = "tensor '" + printable(name) + "'";
  if (!entry.is_object()) {
    fail(ErrorCode::kBadHeader, file, where + " is " + entry.type_name() + ", not an object");
  }
  HeaderTensor t;
  t.name = name;
  const auto& dtype = get_field(file, where, entry, "dtype", json::value_t::string);
  t.dtype = parse_dtype(dtype.get_ref<const std::string&>(), "" + file + ": " + where);

  const auto& shape = get_field(file, where, entry, "shape", json::value_t::array);
  if (shape.size() > kMaxDims) {
    fail(ErrorCode::kBadHeader, file,
         where + ": \"shape\" has " + std::to_string(shape.size()) + " dimensions, more than " +
             std::to_string(kMaxDims));
  }
  t.shape.reserve(shape.size());
  for (const auto& d : shape) {
    const size_t i = t.shape.size();
    t.shape.push_back(static_cast<int64_t>(
        get_uint(file, d, INT64_MAX, [&] { return where + " shape[" + std::to_string(i) + "]"; })));
  }

  const auto& offsets = get_field(file, where, entry, "data_offsets", json::value_t::array);
  if (offsets.size() != 2) {
    fail(ErrorCode::kBadHeader, file,
         where + ": \"data_offsets\" has " + std::to_string(offsets.size()) +
             " elements, expected 2");
  }
  t.begin = get_uint(file, offsets[0], UINT64_MAX, [&] { return where + " data_offsets[0]"; });
  t.end = get_uint(file, offsets[1], UINT64_MAX, [&] { return where + " data_offsets[1]"; });
  if (t.begin > t.end || t.end > data_len) {
    fail(ErrorCode::kBadOffsets, file,
         where + ": data_offsets " + range_string(t.begin, t.end) +
             " is not a range inside the data section of " + std::to_string(data_len) + " bytes");
  }
  const std::optional<uint64_t> nbytes = checked_nbytes(t.dtype, t.shape);
  if (!nbytes) {
    fail(ErrorCode::kBadOffsets, file,
         where + ": the byte size of shape " + shape_string(t.shape) + " overflows");
  }
  if (*nbytes != t.end - t.begin) {
    fail(ErrorCode::kBadOffsets, file,
         where + ": " + std::string(dtype_name(t.dtype)) + " " + shape_string(t.shape) + " needs " +
             std::to_string(*nbytes) + " bytes but data_offsets " + range_string(t.begin, t.end) +
             " hold " + std::to_string(t.end - t.begin));
  }
  return t;
}

std::map<std::string, std::string> parse_metadata(const std::string& file, const json& m) {
  if (!m.is_object()) {
    fail(ErrorCode::kBadHeader, file,
         std::string("\"__metadata__\" is ") + m.type_name() + ", not an object");
  }
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : m.items()) {
    if (!value.is_string()) {
      fail(ErrorCode::kBadHeader, file,
           "\"__metadata__\" value of '" + printable(key) + "' is " + value.type_name() +
               ", not a string");
    }
    out.emplace(key, value.get<std::string>());
  }
  return out;
}

/// Checks that the sorted ranges tile [0, data_len) exactly.
void check_tiling(const std::string& file, const std::vector<HeaderTensor>& tensors,
                  uint64_t data_len) {
  uint64_t expected = 0;
  const HeaderTensor* prev = nullptr;
  for (const auto& t : tensors) {
    if (t.begin < expected) {
      fail(ErrorCode::kBadOffsets, file,
           "tensors '" + printable(prev->name) + "' " + range_string(prev->begin, prev->end) +
               " and '" + printable(t.name) + "' " + range_string(t.begin, t.end) + " overlap");
    }
    if (t.begin > expected) {
      fail(ErrorCode::kBadOffsets, file,
           "hole in the data section: bytes " + range_string(expected, t.begin) +
               " before tensor '" + printable(t.name) + "' belong to no tensor");
    }
    expected = t.end;
    prev = &t;
  }
  if (expected != data_len) {
    fail(ErrorCode::kBadOffsets, file,
         "hole in the data section: bytes " + range_string(expected, data_len) +
             " at its end belong to no tensor");
  }
}

/// Reads exactly `n` bytes at `offset`; a file that ends early is kTruncated.
void read_exact(const std::string& path, int fd, char* buf, size_t n, uint64_t offset) {
  const int64_t got = io::read_full(fd, buf, n, offset);
  if (got < 0) {
    throw_error(ErrorCode::kIo,
                "pread " + path + " at offset " + std::to_string(offset) +
                    " failed: " + std::strerror(static_cast<int>(-got)),
                static_cast<int>(-got));
  }
  if (static_cast<uint64_t>(got) < n) {
    fail(ErrorCode::kTruncated, path,
         "file ended at offset " + std::to_string(offset + static_cast<uint64_t>(got)));
  }
}

}  // namespace

std::string build_header(const std::vector<HeaderTensor>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::vector<std::string_view> names;
  names.reserve(tensors.size());
  uint64_t expected = 0;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == kMetadataKey) {
      throw_error(
          ErrorCode::kInvalidArgument,
          "tensor name '" + t.name + "' is empty, reserved or duplicated in a safetensors header");
    }
    dtype_name(t.dtype);  // Throws InvalidArgument for an unsupported dtype.
    const std::optional<uint64_t> nbytes = checked_nbytes(t.dtype, t.shape);
    if (!nbytes || t.begin != expected || t.end < t.begin || t.end - t.begin != *nbytes) {
      throw_error(ErrorCode::kInternal,
                  "build_header: tensor '" + t.name + "' at " + range_string(t.begin, t.end) +
                      " is not laid out contiguously from offset " + std::to_string(expected));
    }
    expected = t.end;
    names.push_back(t.name);
  }
  std::sort(names.begin(), names.end());
  if (auto dup = std::adjacent_find(names.begin(), names.end()); dup != names.end()) {
    throw_error(ErrorCode::kInvalidArgument,
                "tensor name '" + std::string(*dup) +
                    "' is empty, reserved or duplicated in a safetensors header");
  }

  std::string out(8, '\0');  // The length prefix, filled in below.
  out.reserve(8 + 128 * (tensors.size() + 1));
  JsonWriter w(out);
  w.begin_object();
  if (!metadata.empty()) {
    w.key(kMetadataKey);
    w.begin_object();
    for (const auto& [key, value] : metadata) {
      w.key(key);
      w.string(value);
    }
    w.end_object();
  }
  for (const auto& t : tensors) {
    w.key(t.name);
    w.begin_object();
    w.key("dtype");
    w.string(dtype_name(t.dtype));
    w.key("shape");
    w.begin_array();
    for (int64_t d : t.shape) w.number(d);
    w.end_array();
    w.key("data_offsets");
    w.begin_array();
    w.number(t.begin);
    w.number(t.end);
    w.end_array();
    w.end_object();
  }
  w.end_object();

  const uint64_t total = (out.size() + kAlignment - 1) / kAlignment * kAlignment;
  const uint64_t n = total - 8;
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out.resize(total, ' ');
  return out;
}

uint64_t parse_length_prefix(const std::string& file, std::string_view prefix, uint64_t file_size) {
  if (file_size < 8 || prefix.size() < 8) {
    fail(ErrorCode::kTruncated, file,
         "only " + std::to_string(std::min<uint64_t>(file_size, prefix.size())) +
             " bytes, shorter than the 8-byte header length");
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<unsigned char>(prefix[i])} << (8 * i);
  if (n > kMaxHeaderBytes) {
    fail(ErrorCode::kHeaderTooLarge, file,
         "header length " + std::to_string(n) + " exceeds the cap of " +
             std::to_string(kMaxHeaderBytes) + " bytes");
  }
  if (8 + n > file_size) {
    fail(ErrorCode::kTruncated, file,
         "header length " + std::to_string(n) + " needs " + std::to_string(8 + n) +
             " bytes but the file has " + std::to_string(file_size));
  }
  return 8 + n;
}

Header parse_header(const std::string& file, std::string_view bytes, uint64_t file_size) {
  Header h;
  h.data_offset = parse_length_prefix(file, bytes, file_size);
  if (bytes.size() < h.data_offset) {
    fail(ErrorCode::kTruncated, file,
         "only " + std::to_string(bytes.size()) + " of the " + std::to_string(h.data_offset) +
             " header bytes were read");
  }
  json root;
  // Bounded (format/json_bounds.h): no NUL byte, nesting and value count capped.
  try {
    root = parse_bounded_json(bytes.substr(8, h.data_offset - 8));
  } catch (const json::exception& e) {
    fail(ErrorCode::kBadHeader, file, "header is not valid JSON: " + printable(e.what(), 200));
  } catch (const std::invalid_argument& e) {
    fail(ErrorCode::kBadHeader, file, std::string("header is not bounded JSON: ") + e.what());
  }
  if (!root.is_object()) {
    fail(ErrorCode::kBadHeader, file,
         std::string("header is ") + root.type_name() + ", not a JSON object");
  }
  const uint64_t data_len = file_size - h.data_offset;
  h.tensors.reserve(root.size());
  for (const auto& [key, value] : root.items()) {
    if (key == kMetadataKey) {
      h.metadata = parse_metadata(file, value);
    } else {
      h.tensors.push_back(parse_tensor(file, key, value, data_len));
    }
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const auto& a, const auto& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  check_tiling(file, h.tensors, data_len);
  return h;
}

Header read_header(int fd, uint64_t size, const std::string& label) {
  std::string bytes(std::min<uint64_t>(size, 8), '\0');
  read_exact(label, fd, bytes.data(), bytes.size(), 0);
  const uint64_t data_offset = parse_length_prefix(label, bytes, size);
  bytes.resize(data_offset);
  read_exact(label, fd, bytes.data() + 8, data_offset - 8, 8);
  return parse_header(label, bytes, size);
}

Header read_header(const std::filesystem::path& path) {
  const std::string name = path.string();
  const OpenedFile opened = open_snapshot_file(io::kAtCwd, name, name, "shard");
  return read_header(opened.fd.get(), opened.size(), name);
}

}  // namespace tsnap::format
