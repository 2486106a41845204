// The chunk hash is XXH3-64 with seed 0, whichever build (SSE2 or AVX2) the CPU dispatches to.

#include <gtest/gtest.h>

#include <algorithm>
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
  for (size_t n :
       {1ul, 3ul, 16ul, 17ul, 128ul, 129ul, 240ul, 241ul, 1000ul, 4096ul, 65537ul, 1ul << 20}) {
    EXPECT_EQ(hash64(buf.data(), n), XXH3_64bits(buf.data(), n)) << n;
  }
}

TEST(Hash, StreamInPiecesEqualsOneCall) {
  std::mt19937_64 rng(11);
  std::vector<uint8_t> buf((1 << 20) + 333);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  Hash64Stream stream;
  for (size_t piece : {1ul, 7ul, 64ul, 1000ul, 4096ul, 256ul << 10, buf.size()}) {
    stream.reset();
    for (size_t at = 0; at < buf.size(); at += piece) {
      stream.update(buf.data() + at, std::min(piece, buf.size() - at));
    }
    EXPECT_EQ(stream.digest(), hash64(buf.data(), buf.size())) << piece;
  }
  stream.reset();
  EXPECT_EQ(stream.digest(), hash64("", 0));
}

}  // namespace
}  // namespace tsnap::format
