#include "format/hash.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace tsnap::format {

uint64_t hash64(const void* data, size_t n) noexcept { return XXH3_64bits(data, n); }

}  // namespace tsnap::format
