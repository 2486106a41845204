#include "format/hash.h"

#include <algorithm>
#include <new>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/hex.h"

namespace tsnap::format {

// hash_avx2.cpp: the same functions built for AVX2 (about 1.5x faster here).
uint64_t hash64_avx2(const void* data, size_t n) noexcept;
void hash64_update_avx2(void* state, const void* data, size_t n) noexcept;

namespace {

bool has_avx2() {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
}

}  // namespace

uint64_t hash64(const void* data, size_t n) noexcept {
  return has_avx2() ? hash64_avx2(data, n) : XXH3_64bits(data, n);
}

uint64_t hash64_with_pieces(const uint8_t* data, size_t n,
                            const std::vector<std::pair<uint64_t, uint64_t>>& pieces,
                            std::vector<uint64_t>* piece_hashes) {
  piece_hashes->clear();
  piece_hashes->reserve(pieces.size());
  // Blocks small enough to stay in the L2 cache between the chunk's hash and the pieces'.
  constexpr size_t kBlock = 128 << 10;
  Hash64Stream chunk;
  thread_local Hash64Stream piece;  // a piece that spans blocks
  size_t next = 0;                  // the first piece not finished
  for (size_t at = 0; at < n; at += kBlock) {
    const size_t end = std::min(n, at + kBlock);
    chunk.update(data + at, end - at);
    for (; next < pieces.size() && pieces[next].first < end; ++next) {
      const auto [lo, hi] = pieces[next];
      if (lo >= at && hi <= end) {  // wholly in this block
        piece_hashes->push_back(hash64(data + lo, hi - lo));
        continue;
      }
      if (lo >= at) piece.reset();  // starts in this block
      const uint64_t from = std::max<uint64_t>(lo, at), to = std::min<uint64_t>(hi, end);
      piece.update(data + from, to - from);
      if (hi > end) break;  // goes on in the next block
      piece_hashes->push_back(piece.digest());
    }
  }
  return chunk.digest();
}

std::string hash_hex(uint64_t hash) { return detail::hex64(hash); }

Hash64Stream::Hash64Stream() : state_(XXH3_createState()) {
  if (state_ == nullptr) throw std::bad_alloc();
  reset();
}

Hash64Stream::~Hash64Stream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Hash64Stream::reset() noexcept { XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_)); }

void Hash64Stream::update(const void* data, size_t n) noexcept {
  if (has_avx2()) {
    hash64_update_avx2(state_, data, n);
  } else {
    XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, n);
  }
}

uint64_t Hash64Stream::digest() const noexcept {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

}  // namespace tsnap::format
