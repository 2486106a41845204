#include "restore/mapped_snapshot.h"

#include <sys/mman.h>

#include <cstring>

#include "common/sys_error.h"
#include "format/dtype.h"
#include "format/manifest_io.h"
#include "restore/read_snapshot.h"
#include "restore/s3_fetch.h"
#include "restore/shard_reader.h"
#include "tsnap/error.h"

namespace tsnap::restore {

// One mapped shard and which of its chunks have been verified.
struct MappedSnapshot::Mapping {
  std::unique_ptr<ShardReader> reader;
  uint8_t* base = nullptr;
  std::unique_ptr<std::atomic<bool>[]> verified;

  ~Mapping() {
    if (base != nullptr) ::munmap(base, reader->file().size);
  }
};

std::shared_ptr<const MappedSnapshot> MappedSnapshot::open(const std::filesystem::path& path,
                                                           bool verify) {
  if (format::is_s3(path)) {
    // Shards are mapped on first use: the local copy lives as long as the mappings.
    auto fetched = std::make_shared<const FetchedSnapshot>(path.native());
    auto mapped =
        std::make_shared<MappedSnapshot>(format::SnapshotDir::open(fetched->path()), verify);
    mapped->fetched_ = std::move(fetched);
    return mapped;
  }
  return read_snapshot(path, [&](const format::SnapshotDir& dir) {
    return std::make_shared<const MappedSnapshot>(dir, verify);
  });
}

MappedSnapshot::MappedSnapshot(const format::SnapshotDir& dir, bool verify)
    : dir_(dir.duplicate()), verify_(verify), manifest_(format::read_manifest_in(dir_)) {
  index_ = index_records(manifest_);
  for (size_t i = 1; i < manifest_.tensors.size(); ++i) {
    if (manifest_.tensors[i].name == manifest_.tensors[i - 1].name) {
      pieced_.insert(manifest_.tensors[i].name);
    }
  }
  for (size_t i = 0; i < manifest_.files.size(); ++i)
    file_index_.emplace(manifest_.files[i].name, i);
  maps_.resize(manifest_.files.size());
}

MappedSnapshot::~MappedSnapshot() = default;

const TensorRecord* MappedSnapshot::find(const std::string& key) const {
  const auto it = index_.find(key);
  return it == index_.end() ? nullptr : it->second;
}

const MappedSnapshot::Mapping& MappedSnapshot::mapping(const std::string& file) const {
  const size_t i = file_index_.at(file);
  std::lock_guard<std::mutex> lock(mu_);
  if (maps_[i]) return *maps_[i];
  auto m = std::make_unique<Mapping>();
  try {
    m->reader = std::make_unique<ShardReader>(dir_, manifest_.files[i], manifest_);
  } catch (const Error& e) {
    if (!lost_to_overwrite(e, dir_)) throw;
    throw_error(e.code(),
                std::string(e.what()) +
                    " (the snapshot was overwritten after it was opened: open it again)",
                e.sys_errno());
  }
  const uint64_t size = m->reader->file().size;
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, m->reader->fd(), 0);
  if (p == MAP_FAILED) detail::throw_sys_error(-errno, "mmap " + m->reader->path());
  m->base = static_cast<uint8_t*>(p);
  m->verified.reset(new std::atomic<bool>[manifest_.files[i].chunk_hashes.size()]());
  maps_[i] = std::move(m);
  return *maps_[i];
}

const uint8_t* MappedSnapshot::bytes(const TensorRecord& r, uint64_t begin, uint64_t end) const {
  if (begin >= end) return nullptr;  // nothing to read: the shard is not needed
  const Mapping& m = mapping(r.file);
  if (verify_) {
    // Hashes the not yet verified chunks under [begin, end).
    const uint64_t cb = m.reader->file().chunk_bytes;
    for (uint64_t c = begin / cb; c <= (end - 1) / cb; ++c) {
      if (m.verified[c].load(std::memory_order_acquire)) continue;
      if (!m.reader->chunk_ok(c, m.base + c * cb, m.reader->chunk_length(c))) {
        m.reader->throw_hash_mismatch(c);
      }
      m.verified[c].store(true, std::memory_order_release);
    }
  }
  return m.base + begin;
}

void MappedSnapshot::read_box(const std::vector<const TensorRecord*>& pieces, const Box& want,
                              uint8_t* out) const {
  const TensorRecord& first = *pieces.front();
  const uint64_t elem = format::element_size(first.dtype);
  uint64_t wanted = 1, covered = 0;
  for (int64_t d : want.shape) wanted *= static_cast<uint64_t>(d);
  for (const TensorRecord* p : pieces) {
    const std::vector<Run> runs = overlap_runs(box_of(*p), want);
    if (runs.empty()) continue;
    uint64_t lo = UINT64_MAX, hi = 0;
    for (const Run& r : runs) {
      lo = std::min(lo, r.src * elem);
      hi = std::max(hi, (r.src + r.n) * elem);
      covered += r.n;
    }
    if (hi == lo) continue;
    const uint8_t* src = bytes(*p, p->begin + lo, p->begin + hi) - lo;
    for (const Run& r : runs) std::memcpy(out + r.dst * elem, src + r.src * elem, r.n * elem);
  }
  if (covered != wanted) {
    throw_error(ErrorCode::kUnsupported, "tensor '" + first.name + "' cannot be assembled: its " +
                                             std::to_string(pieces.size()) + " pieces hold " +
                                             std::to_string(covered) + " of the " +
                                             std::to_string(wanted) + " elements asked for");
  }
}

}  // namespace tsnap::restore
