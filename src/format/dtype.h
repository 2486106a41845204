#pragma once
// Mapping between LibTorch dtypes and safetensors dtype names (docs/format.md, "dtypes"), and
// the quoting of untrusted names in the format layer's error messages.

#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tsnap::format {

/// Most dimensions a stored tensor may have (LibTorch's own kernels cap ndim at 64 or lower).
inline constexpr size_t kMaxDims = 64;

/// True for the dtypes format v1 stores: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL.
bool is_supported(at::ScalarType t) noexcept;
/// True for F64, F32, F16, BF16 (the dtypes a save may convert).
bool is_floating(at::ScalarType t) noexcept;
/// "F32" for at::kFloat, ...; throws InvalidArgument naming the dtype if unsupported.
std::string_view dtype_name(at::ScalarType t);
/// Inverse of dtype_name without throwing: nullopt for an unknown name.
std::optional<at::ScalarType> find_dtype(std::string_view name) noexcept;
/// Inverse of dtype_name; throws FormatError(kBadHeader) naming `name` and `where`.
at::ScalarType parse_dtype(std::string_view name, const std::string& where);
/// Bytes per element; 0 for a dtype format v1 does not store.
size_t element_size(at::ScalarType t) noexcept;
/// Bytes of a tensor of dtype `t` and `shape`, or nullopt when `t` is not stored by format v1,
/// a dimension is negative, the element count (counting zero dimensions as 1, so that strides
/// stay representable) exceeds INT64_MAX, or the byte size overflows uint64_t.
std::optional<uint64_t> checked_nbytes(at::ScalarType t,
                                       const std::vector<int64_t>& shape) noexcept;

/// Text read from a file, made safe for an error message: at most `max` bytes, and control
/// bytes (NUL included) written as \xNN.
std::string printable(std::string_view text, size_t max = 64);

}  // namespace tsnap::format
