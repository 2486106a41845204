#include "pipeline/durable_store.h"

#include <fcntl.h>

#include <algorithm>

#include "common/sys_error.h"
#include "format/hash.h"
#include "format/s3_root.h"
#include "io/fd.h"
#include "pipeline/dir_store.h"
#include "pipeline/s3_store.h"
#include "tsnap/error.h"

namespace tsnap::pipeline {

CheckedSource::CheckedSource(const format::OpenedFile& file, std::string label,
                             const FileRecord& record, std::string target)
    : file_(file), label_(std::move(label)), record_(record), target_(std::move(target)) {}

void CheckedSource::check_size() const {
  if (file_.size() == record_.size) return;
  throw_error(file_.size() < record_.size ? ErrorCode::kTruncated : ErrorCode::kBadManifest,
              "drain: " + label_ + " is " + std::to_string(file_.size()) +
                  " bytes, the manifest says " + std::to_string(record_.size) +
                  "; not written to " + target_);
}

void CheckedSource::read(uint64_t begin, size_t len, uint8_t* out) const {
  const int64_t n = io::read_full(file_.fd.get(), out, len, begin);
  if (n < 0) detail::throw_sys_error(static_cast<int>(n), "read " + label_);
  if (static_cast<size_t>(n) != len) {
    throw_error(ErrorCode::kTruncated, "drain: " + label_ + " ended at byte " +
                                           std::to_string(begin + static_cast<uint64_t>(n)) +
                                           "; not written to " + target_);
  }
  const uint64_t chunk = std::max<uint64_t>(record_.chunk_bytes, 1);
  for (uint64_t at = 0; at < len; at += chunk) {
    const uint64_t c = (begin + at) / chunk;
    const size_t clen = static_cast<size_t>(std::min<uint64_t>(chunk, len - at));
    const uint64_t hash = format::hash64(out + at, clen);
    if (c >= record_.chunk_hashes.size() || hash != record_.chunk_hashes[c]) {
      throw_error(ErrorCode::kHashMismatch,
                  "drain: chunk " + std::to_string(c) + " of " + label_ + " (bytes [" +
                      std::to_string(begin + at) + ", " + std::to_string(begin + at + clen) +
                      ")) has XXH3-64 " + format::hash_hex(hash) + ", the manifest says " +
                      (c < record_.chunk_hashes.size() ? format::hash_hex(record_.chunk_hashes[c])
                                                       : std::string("no such chunk")) +
                      "; the snapshot is not written to " + target_);
    }
  }
}

void CheckedSource::release() const { ::posix_fadvise(file_.fd.get(), 0, 0, POSIX_FADV_DONTNEED); }

std::unique_ptr<DurableStore> DurableStore::open(DurableConfig config) {
  if (format::is_s3(config.root)) return make_s3_store(std::move(config));
  return make_dir_store(std::move(config));
}

}  // namespace tsnap::pipeline
