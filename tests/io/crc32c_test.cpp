#include "io/crc32c.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace tsnap::io {
namespace {

// Bit by bit, as the definition reads (reflected Castagnoli polynomial).
uint32_t reference(const uint8_t* p, size_t n) {
  uint32_t c = ~0u;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? 0x82f63b78u : 0u);
  }
  return ~c;
}

TEST(Crc32c, KnownValues) {
  EXPECT_EQ(crc32c("", 0), 0u);
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);  // the standard check value
  EXPECT_EQ(crc32c("hello", 5), 0x9a71bb4cu);
  EXPECT_EQ(crc32c_base64(0x9a71bb4cu), "mnG7TA==");
  EXPECT_EQ(crc32c_base64(0), "AAAAAA==");
  EXPECT_EQ(crc32c_base64(0xffffffffu), "/////w==");
}

TEST(Crc32c, EveryLengthAndAlignmentMatchesTheDefinition) {
  std::mt19937 rng(7);
  std::vector<uint8_t> data(4096 + 64);
  for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
  for (size_t offset = 0; offset < 9; ++offset) {
    for (size_t n : {0, 1, 7, 8, 9, 15, 16, 63, 64, 65, 1000, 4096}) {
      EXPECT_EQ(crc32c(data.data() + offset, n), reference(data.data() + offset, n))
          << offset << "+" << n;
    }
  }
}

TEST(Crc32c, PiecesContinueWhereTheyLeftOff) {
  const std::string s(1 << 20, 'q');
  const uint32_t whole = crc32c(s.data(), s.size());
  for (size_t cut : {size_t{1}, size_t{13}, size_t{4096}, s.size() - 3}) {
    EXPECT_EQ(crc32c(s.data() + cut, s.size() - cut, crc32c(s.data(), cut)), whole) << cut;
  }
}

}  // namespace
}  // namespace tsnap::io
