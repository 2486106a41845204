// tsnap::verify: every chunk of every shard of a snapshot read and hashed; the bad ones are
// reported, not thrown. Needs no LibTorch (the command-line tool's `verify` runs it).
//
// A snapshot is read by the load path first (restore/read_chunks.h: O_DIRECT, several chunks
// in flight, hashed on every core), which stops at the first problem; only then is it walked
// chunk by chunk to name every bad chunk. A sound snapshot is thus verified at the speed of a
// load, and a damaged one reported whole.

#include <algorithm>
#include <memory>
#include <vector>

#include "format/manifest_io.h"
#include "format/storage_root.h"
#include "restore/read_chunks.h"
#include "restore/read_plan.h"
#include "restore/read_snapshot.h"
#include "restore/s3_fetch.h"
#include "restore/shard_reader.h"
#include "tsnap/error.h"
#include "tsnap/load.h"

namespace tsnap {
namespace {

// Every chunk of every file of `m`, whole.
restore::ReadPlan every_chunk(const Manifest& m) {
  restore::ReadPlan plan;
  for (size_t i = 0; i < m.files.size(); ++i) {
    const FileRecord& f = m.files[i];
    plan.files.push_back(&f);
    for (uint64_t c = 0; c < f.chunk_hashes.size(); ++c) {
      const uint64_t offset = c * f.chunk_bytes;
      const uint64_t length = std::min(f.chunk_bytes, f.size - std::min(f.size, offset));
      plan.chunks.push_back({i, c, offset, length, {}});
      plan.max_chunk_length = std::max(plan.max_chunk_length, length);
      plan.bytes += length;
    }
  }
  return plan;
}

// True when every chunk of the snapshot reads and hashes right (the fast path).
bool sound(const format::SnapshotDir& dir, const Manifest& m) {
  try {
    restore::read_chunks(dir, m, {}, every_chunk(m), LoadOptions{}, /*in_place=*/false);
    return true;
  } catch (const Error& e) {
    if (restore::lost_to_overwrite(e, dir)) throw;
    return false;
  } catch (const std::exception&) {
    return false;  // e.g. no memory for the read buffers: the walk below needs one chunk
  }
}

}  // namespace

std::vector<BadChunk> verify(const std::filesystem::path& path) {
  if (format::is_s3(path)) {
    const auto [root, name] = format::StorageRoot::of_snapshot(path);
    return restore::verify_stored(*root, name);
  }
  return restore::read_snapshot(path, [](const format::SnapshotDir& dir) {
    const Manifest m = format::read_manifest_in(dir);
    if (sound(dir, m)) return std::vector<BadChunk>{};
    // Every shard is opened first: a shard gone because the name was overwritten meanwhile
    // starts the verification over on the new snapshot instead of reporting it.
    std::vector<std::unique_ptr<restore::ShardReader>> readers(m.files.size());
    std::vector<BadChunk> bad;
    for (size_t i = 0; i < m.files.size(); ++i) {
      try {
        readers[i] = std::make_unique<restore::ShardReader>(dir, m.files[i], m);
      } catch (const Error& e) {
        if (restore::lost_to_overwrite(e, dir)) throw;
        bad.push_back({m.files[i].name, 0, 0, e.what()});
      }
    }
    for (size_t i = 0; i < m.files.size(); ++i) {
      if (!readers[i]) continue;
      const FileRecord& f = m.files[i];
      restore::ShardReader& reader = *readers[i];
      std::vector<uint8_t> buf(reader.chunk_length(0));
      for (uint64_t c = 0; c < f.chunk_hashes.size(); ++c) {
        try {
          const uint64_t len = reader.read_chunk(c, buf.data(), /*verify=*/false);
          if (!reader.chunk_ok(c, buf.data(), len)) {
            bad.push_back({f.name, c, c * f.chunk_bytes, "hash mismatch"});
          }
        } catch (const Error& e) {
          bad.push_back({f.name, c, c * f.chunk_bytes, e.what()});
        }
      }
    }
    return bad;
  });
}

}  // namespace tsnap
