#pragma once
// Mapping between LibTorch dtypes and safetensors dtype names (docs/format.md, "dtypes").

#include <c10/core/ScalarType.h>

#include <cstddef>
#include <string>
#include <string_view>

namespace tsnap::format {

/// True for the dtypes format v1 stores: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL.
bool is_supported(at::ScalarType t) noexcept;
/// True for F64, F32, F16, BF16 (the dtypes a save may convert).
bool is_floating(at::ScalarType t) noexcept;
/// "F32" for at::kFloat, ...; throws InvalidArgument naming the dtype if unsupported.
std::string_view dtype_name(at::ScalarType t);
/// Inverse of dtype_name; throws FormatError(kBadHeader) naming `name` and `where`.
at::ScalarType parse_dtype(std::string_view name, const std::string& where);
/// Bytes per element.
size_t element_size(at::ScalarType t) noexcept;

}  // namespace tsnap::format
