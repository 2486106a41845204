#include "format/convert.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cpuid.h>
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "format/dtype.h"
#include "tsnap/error.h"

namespace tsnap::format {
namespace {

// f32 -> bf16, round to nearest even; bit-identical to LibTorch's vectorised
// Tensor::to(kBFloat16), which turns every NaN into 0xFFFF.
inline uint16_t bf16_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return 0xFFFF;
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

void f32_to_bf16_scalar(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_bits(src[i]);
}

// The same, 16 at a time with AVX2.
__attribute__((target("avx2"))) inline __m256i bf16_round8(__m256i x) {
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i r =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF)),
                                            _mm256_set1_epi32(0x7F800000));
  return _mm256_blendv_epi8(r, _mm256_set1_epi32(0xFFFF), is_nan);
}

__attribute__((target("avx2"))) void f32_to_bf16_avx2(const float* __restrict src,
                                                      uint16_t* __restrict dst, size_t n) {
  const auto round = bf16_round8;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a = round(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    const __m256i b = round(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 8)));
    // packus works per 128-bit lane: [a0-3 b0-3 | a4-7 b4-7]; restore the order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), packed);
  }
  f32_to_bf16_scalar(src + i, dst + i, n - i);
}

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}

// f32 -> f16 with the F16C instruction (round to nearest even, as c10::Half(float)), 8 at a time.
__attribute__((target("avx,f16c"))) void f32_to_f16_f16c(const float* __restrict src,
                                                         uint16_t* __restrict dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(src + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) dst[i] = c10::Half(src[i]).x;
}

// F16C from CPUID leaf 1 (clang 14's __builtin_cpu_supports does not know "f16c"); the "avx"
// check also covers the OS saving the YMM registers.
bool has_f16c() {
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
  }();
  return yes;
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
    case at::kDouble:
      return cast<From, double>(src, dst, n);
    case at::kFloat:
      return cast<From, float>(src, dst, n);
    case at::kHalf:
      return cast<From, c10::Half>(src, dst, n);
    case at::kBFloat16:
      return cast<From, c10::BFloat16>(src, dst, n);
    default:
      break;
  }
  throw_error(ErrorCode::kInternal, std::string("no conversion to ") + c10::toString(to));
}

}  // namespace

void convert(const void* src, at::ScalarType from, void* dst, at::ScalarType to, size_t n) {
  if (from == to) {
    std::memcpy(dst, src, n * element_size(from));
    return;
  }
  if (from == at::kFloat && to == at::kBFloat16) {
    const auto* s = static_cast<const float*>(src);
    auto* d = static_cast<uint16_t*>(dst);
    return has_avx2() ? f32_to_bf16_avx2(s, d, n) : f32_to_bf16_scalar(s, d, n);
  }
  if (from == at::kFloat && to == at::kHalf && has_f16c()) {
    return f32_to_f16_f16c(static_cast<const float*>(src), static_cast<uint16_t*>(dst), n);
  }
  switch (from) {
    case at::kDouble:
      return cast_from<double>(src, dst, to, n);
    case at::kFloat:
      return cast_from<float>(src, dst, to, n);
    case at::kHalf:
      return cast_from<c10::Half>(src, dst, to, n);
    case at::kBFloat16:
      return cast_from<c10::BFloat16>(src, dst, to, n);
    default:
      break;
  }
  throw_error(ErrorCode::kInternal, std::string("no conversion from ") + c10::toString(from));
}

}  // namespace tsnap::format
