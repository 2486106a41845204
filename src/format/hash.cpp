#include "format/hash.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace tsnap::format {

// hash_avx2.cpp: the same function built for AVX2 (about 1.5x faster here).
uint64_t hash64_avx2(const void* data, size_t n) noexcept;

uint64_t hash64(const void* data, size_t n) noexcept {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2 ? hash64_avx2(data, n) : XXH3_64bits(data, n);
}

}  // namespace tsnap::format
