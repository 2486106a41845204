#pragma once
// Lowercase hexadecimal spellings, in one place: chunk hashes in manifests and messages, digests
// sent to object storage, and control bytes escaped as \xHH in names shown to users.

#include <cstddef>
#include <cstdint>
#include <string>

namespace tsnap::detail {

inline constexpr char kHexDigits[] = "0123456789abcdef";

/// Appends byte `u` as "\xHH".
inline void append_escaped_byte(std::string& out, unsigned char u) {
  out += {'\\', 'x', kHexDigits[u >> 4], kHexDigits[u & 15]};
}

/// The `n` bytes at `p` as 2n hex digits.
inline std::string hex_bytes(const unsigned char* p, size_t n) {
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = kHexDigits[p[i] >> 4];
    s[2 * i + 1] = kHexDigits[p[i] & 15];
  }
  return s;
}

/// `v` as 16 hex digits, most significant first (how manifests spell XXH3-64 hashes).
inline std::string hex64(uint64_t v) {
  std::string s(16, '0');
  for (int i = 0; i < 16; ++i) s[i] = kHexDigits[(v >> (60 - 4 * i)) & 15];
  return s;
}

}  // namespace tsnap::detail
