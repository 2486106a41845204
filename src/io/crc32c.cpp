#include "io/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace tsnap::io {
namespace {

constexpr uint32_t kPoly = 0x82f63b78u;  // Castagnoli, reflected

std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? kPoly : 0u);
    t[i] = c;
  }
  return t;
}

uint32_t crc32c_table(const uint8_t* p, size_t n, uint32_t crc) noexcept {
  static const std::array<uint32_t, 256> table = make_table();
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xffu] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const uint8_t* p, size_t n,
                                                        uint32_t crc) noexcept {
  uint64_t c = crc;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n > 0; ++p, --n) c32 = _mm_crc32_u8(c32, *p);
  return c32;
}

bool has_sse42() noexcept {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) noexcept {
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
#if defined(__x86_64__)
  if (has_sse42()) return ~crc32c_sse42(p, n, crc);
#endif
  return ~crc32c_table(p, n, crc);
}

std::string crc32c_base64(uint32_t crc) {
  static constexpr char kDigits[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  // 4 bytes: 32 bits in five 6-bit digits and a last one of 2 bits, then "==".
  const uint64_t v = static_cast<uint64_t>(crc) << 16;  // 48 bits: the 4 bytes and 2 zero ones
  std::string out;
  for (int shift = 42; shift >= 12; shift -= 6) out += kDigits[(v >> shift) & 0x3fu];
  out += "==";
  return out;
}

}  // namespace tsnap::io
