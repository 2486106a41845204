// The chunk hash is XXH3-64 with seed 0, whichever build (SSE2 or AVX2) the CPU dispatches to.

#include <gtest/gtest.h>

#include <random>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "format/hash.h"

namespace tsnap::format {
namespace {

TEST(Hash, KnownAnswer) { EXPECT_EQ(hash64("", 0), 0x2D06800538D394C2ull); }

TEST(Hash, EqualsTheReferenceBuildForEverySize) {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> buf(1 << 20);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t n : {1ul, 3ul, 16ul, 17ul, 128ul, 129ul, 240ul, 241ul, 1000ul, 4096ul, 65537ul,
                   1ul << 20}) {
    EXPECT_EQ(hash64(buf.data(), n), XXH3_64bits(buf.data(), n)) << n;
  }
}

}  // namespace
}  // namespace tsnap::format
