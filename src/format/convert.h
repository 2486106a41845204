#pragma once
// The dtype conversion kernel that staging (save) and restore share: copies elements converting
// between floating dtypes in one pass, rounding exactly as LibTorch's Tensor::to() does (round to
// nearest even; NaN stays NaN). Results are bit-identical to Tensor::to() on the CPU except for
// the payload bits of NaNs (docs/format.md, "Dtypes").

#include <c10/core/ScalarType.h>

#include <cstddef>

namespace tsnap::format {

/// Copies `n` elements from `src` (dtype `from`) to `dst` (dtype `to`). Same dtype: memcpy.
/// Otherwise both must be floating (f64, f32, f16, bf16); the caller checked this.
void convert(const void* src, at::ScalarType from, void* dst, at::ScalarType to, size_t n);

}  // namespace tsnap::format
