#include "format/dtype.h"

#include <algorithm>
#include <array>

#include "common/hex.h"
#include "tsnap/error.h"

namespace tsnap::format {
namespace {

struct DtypeInfo {
  at::ScalarType type;
  std::string_view name;
  size_t size;
};

constexpr std::array<DtypeInfo, 10> kDtypes{{
    {at::kDouble, "F64", 8},
    {at::kFloat, "F32", 4},
    {at::kHalf, "F16", 2},
    {at::kBFloat16, "BF16", 2},
    {at::kLong, "I64", 8},
    {at::kInt, "I32", 4},
    {at::kShort, "I16", 2},
    {at::kChar, "I8", 1},
    {at::kByte, "U8", 1},
    {at::kBool, "BOOL", 1},
}};

const DtypeInfo* info(at::ScalarType t) noexcept {
  for (const auto& d : kDtypes) {
    if (d.type == t) return &d;
  }
  return nullptr;
}

}  // namespace

bool is_supported(at::ScalarType t) noexcept { return info(t) != nullptr; }

bool is_floating(at::ScalarType t) noexcept {
  return t == at::kDouble || t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

std::string_view dtype_name(at::ScalarType t) {
  if (const DtypeInfo* d = info(t)) return d->name;
  throw_error(ErrorCode::kInvalidArgument,
              std::string("dtype ") + c10::toString(t) +
                  " is not supported by format v1 (F64 F32 F16 BF16 I64 I32 I16 I8 U8 "
                  "BOOL)");
}

std::optional<at::ScalarType> find_dtype(std::string_view name) noexcept {
  for (const auto& d : kDtypes) {
    if (d.name == name) return d.type;
  }
  return std::nullopt;
}

at::ScalarType parse_dtype(std::string_view name, const std::string& where) {
  if (auto t = find_dtype(name)) return *t;
  throw_error(ErrorCode::kBadHeader, where + ": unknown dtype \"" + printable(name, 32) + "\"");
}

size_t element_size(at::ScalarType t) noexcept {
  const DtypeInfo* d = info(t);
  return d ? d->size : 0;
}

std::optional<uint64_t> checked_nbytes(at::ScalarType t,
                                       const std::vector<int64_t>& shape) noexcept {
  const size_t elsize = element_size(t);
  if (elsize == 0) return std::nullopt;
  int64_t bound = 1;  // Product of max(dim, 1): the largest stride a contiguous tensor needs.
  uint64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(bound, std::max<int64_t>(d, 1), &bound)) {
      return std::nullopt;
    }
    numel *= static_cast<uint64_t>(d);  // Cannot overflow: numel <= bound.
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(bound), elsize, &nbytes)) return std::nullopt;
  return numel * elsize;
}

std::string printable(std::string_view text, size_t max) {
  std::string out;
  for (char c : text.substr(0, max)) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      detail::append_escaped_byte(out, u);
    } else {
      out += c;
    }
  }
  if (text.size() > max) out += "...";
  return out;
}

}  // namespace tsnap::format
