#pragma once
// Chunk hashing: XXH3-64 (seed 0), as recorded in the manifest, in one call or in pieces.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tsnap::format {

/// XXH3-64 of `n` bytes at `data`.
uint64_t hash64(const void* data, size_t n) noexcept;

/// XXH3-64 of `n` bytes at `data` and, in the same pass over memory, of each byte range
/// [first, second) of `pieces` (ascending, not overlapping, within [0, n)) into `*piece_hashes`
/// (one per piece, in order): a staged chunk's hash and the hashes of the tensor pieces it holds
/// read the chunk once. Thread-safe (calls are independent).
uint64_t hash64_with_pieces(const uint8_t* data, size_t n,
                            const std::vector<std::pair<uint64_t, uint64_t>>& pieces,
                            std::vector<uint64_t>* piece_hashes);

/// A hash as messages spell it: 16 lower-case hex digits.
std::string hash_hex(uint64_t hash);

/// XXH3-64 of bytes given in pieces (the same value as hash64 of their concatenation), so that
/// a reader can hash each piece while it is in the cache for another use (the restore path
/// hashes and copies a chunk piece by piece). Thread-safety: one thread at a time.
/// Ownership: owns its state; reusable after reset().
class Hash64Stream {
 public:
  Hash64Stream();
  ~Hash64Stream();
  Hash64Stream(const Hash64Stream&) = delete;
  Hash64Stream& operator=(const Hash64Stream&) = delete;
  /// Starts over (a new, empty input).
  void reset() noexcept;
  /// Appends `n` bytes at `data`.
  void update(const void* data, size_t n) noexcept;
  /// XXH3-64 of everything appended since the last reset.
  uint64_t digest() const noexcept;

 private:
  void* state_;  // XXH3_state_t, aligned as xxhash needs
};

}  // namespace tsnap::format
