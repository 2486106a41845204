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

// A chunk's hash and its tensor pieces' hashes in one pass equal separate calls: pieces within
// one block, across blocks, touching and apart, the chunk's first and last bytes.
TEST(Hash, ChunkAndPiecesInOnePassEqualSeparateCalls) {
  std::mt19937_64 rng(11);
  std::vector<uint8_t> buf(3 << 20);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (int round = 0; round < 50; ++round) {
    const size_t n = 1 + rng() % buf.size();
    std::vector<uint64_t> cuts = {0, n};
    for (int i = rng() % 20; i > 0; --i) cuts.push_back(rng() % n);
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    std::vector<std::pair<uint64_t, uint64_t>> pieces;
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      if (rng() % 4 != 0) pieces.emplace_back(cuts[i], cuts[i + 1]);  // some gaps
    }
    std::vector<uint64_t> got;
    EXPECT_EQ(hash64_with_pieces(buf.data(), n, pieces, &got), hash64(buf.data(), n)) << n;
    ASSERT_EQ(got.size(), pieces.size());
    for (size_t i = 0; i < pieces.size(); ++i) {
      EXPECT_EQ(got[i], hash64(buf.data() + pieces[i].first, pieces[i].second - pieces[i].first))
          << "round " << round << " piece " << i;
    }
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
