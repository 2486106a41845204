#pragma once
// What the manifest's reader and writer (manifest_parse.cpp, manifest_write.cpp) share: the
// spelling of its checksum member and of a 64-bit hash, and the order of a key's pieces.

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>

#include "tsnap/manifest.h"

namespace tsnap::format {

// The manifest's last member, `,\n"checksum":"xxh3-64:<16 hex>"`: the checksum covers every
// byte before the comma.
inline constexpr const char* kChecksumMember = ",\n\"checksum\":\"";
inline constexpr const char* kChecksumPrefix = "xxh3-64:";

/// `h` as 16 lowercase hex digits.
inline std::string hex16(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, h);
  return buf;
}

/// Orders tensor records by key; within a key, a record without a shard first, then the pieces
/// by their offsets.
inline bool shard_before(const TensorRecord* a, const TensorRecord* b) {
  if (a->name != b->name) return a->name < b->name;
  if (a->shard && b->shard) return a->shard->offsets < b->shard->offsets;
  return static_cast<bool>(b->shard) && !a->shard;
}

}  // namespace tsnap::format
