#pragma once
// Chunk hashing: XXH3-64 (seed 0), as recorded in the manifest.

#include <cstddef>
#include <cstdint>

namespace tsnap::format {

/// XXH3-64 of `n` bytes at `data`.
uint64_t hash64(const void* data, size_t n) noexcept;

}  // namespace tsnap::format
