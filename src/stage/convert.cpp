#include "stage/convert.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

#include "tsnap/error.h"

namespace tsnap::stage {
namespace {

// f32 -> bf16, round to nearest even, branch-free so that the loop vectorises; bit-identical to
// LibTorch's vectorised Tensor::to(kBFloat16) (which turns every NaN into 0xFFFF).
void f32_to_bf16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &src[i], sizeof bits);
    const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
    dst[i] = nan ? uint16_t{0xFFFF} : static_cast<uint16_t>(rounded);
  }
}

template <typename From, typename To>
void cast(const void* src, void* dst, size_t n) {
  const From* s = static_cast<const From*>(src);
  To* d = static_cast<To*>(dst);
  for (size_t i = 0; i < n; ++i) {
    // Through float (or double for f64), as c10's conversions do.
    if constexpr (std::is_same_v<From, double> || std::is_same_v<To, double>) {
      d[i] = static_cast<To>(static_cast<double>(s[i]));
    } else {
      d[i] = static_cast<To>(static_cast<float>(s[i]));
    }
  }
}

template <typename From>
void cast_from(const void* src, void* dst, at::ScalarType to, size_t n) {
  switch (to) {
    case at::kDouble: return cast<From, double>(src, dst, n);
    case at::kFloat: return cast<From, float>(src, dst, n);
    case at::kHalf: return cast<From, c10::Half>(src, dst, n);
    case at::kBFloat16: return cast<From, c10::BFloat16>(src, dst, n);
    default: break;
  }
  throw Error(ErrorCode::kInternal, std::string("no conversion to ") + c10::toString(to));
}

}  // namespace

void convert(const void* src, at::ScalarType from, void* dst, at::ScalarType to, size_t n) {
  if (from == to) {
    std::memcpy(dst, src, n * c10::elementSize(from));
    return;
  }
  if (from == at::kFloat && to == at::kBFloat16) {
    return f32_to_bf16(static_cast<const float*>(src), static_cast<uint16_t*>(dst), n);
  }
  switch (from) {
    case at::kDouble: return cast_from<double>(src, dst, to, n);
    case at::kFloat: return cast_from<float>(src, dst, to, n);
    case at::kHalf: return cast_from<c10::Half>(src, dst, to, n);
    case at::kBFloat16: return cast_from<c10::BFloat16>(src, dst, to, n);
    default: break;
  }
  throw Error(ErrorCode::kInternal, std::string("no conversion from ") + c10::toString(from));
}

}  // namespace tsnap::stage
