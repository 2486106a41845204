// XXH3-64 built with AVX2 (this file alone is compiled with -mavx2, see CMakeLists.txt);
// hash.cpp calls it only where the CPU has AVX2. Same results as the SSE2 build.

#include <cstddef>
#include <cstdint>

#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

namespace tsnap::format {

uint64_t hash64_avx2(const void* data, size_t n) noexcept { return XXH3_64bits(data, n); }

// `state` is an XXH3_state_t of hash.cpp: the same struct (one header, one layout).
void hash64_update_avx2(void* state, const void* data, size_t n) noexcept {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state), data, n);
}

}  // namespace tsnap::format
