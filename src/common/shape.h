#pragma once
// Shapes in messages and listings: "[2, 3]". Shapes from hostile files can have thousands of
// dimensions, so at most kMaxShownDims are spelled out ("[1, 1, ..., ...]").

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>

namespace tsnap::detail {

inline constexpr size_t kMaxShownDims = 8;

std::string shape_string(c10::ArrayRef<int64_t> shape);

}  // namespace tsnap::detail
