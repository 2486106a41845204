// The lazy reader: each shard is opened (relative to the snapshot directory opened with the
// reader, so it reads the tree it was opened on), checked against the manifest (ShardReader)
// and mapped privately (copy-on-write) on first use; tensors
// are views of the mapping whose deleter keeps the reader's state alive; verified chunks are
// remembered so each is hashed at most once.

#include "tsnap/reader.h"

#include <ATen/ATen.h>
#include <sys/mman.h>

#include <atomic>
#include <mutex>
#include <set>
#include <unordered_map>

#include "common/hidden.h"
#include "common/sys_error.h"
#include "format/manifest_io.h"
#include "restore/read_plan.h"
#include "restore/read_snapshot.h"
#include "restore/shard_reader.h"
#include "tsnap/error.h"

namespace tsnap {

namespace {

// One mapped shard and which of its chunks have been verified.
struct Mapping {
  std::unique_ptr<restore::ShardReader> reader;
  uint8_t* base = nullptr;
  std::unique_ptr<std::atomic<bool>[]> verified;

  ~Mapping() {
    if (base != nullptr) ::munmap(base, reader->file().size);
  }
};

}  // namespace

struct TSNAP_HIDDEN SnapshotReader::Impl {
  format::SnapshotDir dir;  // its own descriptor of the directory opened
  OpenOptions options;
  Manifest manifest;
  restore::RecordIndex index;  // into `manifest`
  std::set<std::string> pieced;  // keys stored as several pieces
  std::unordered_map<std::string_view, size_t> file_index;
  mutable std::mutex mu;
  mutable std::vector<std::unique_ptr<Mapping>> maps;  // by file index, made on first use
  std::shared_ptr<const restore::FetchedSnapshot> fetched;  // the local copy of an s3:// one

  Impl(const format::SnapshotDir& d, const OpenOptions& o)
      : dir(d.duplicate()), options(o), manifest(format::read_manifest_in(dir)) {
    index = restore::index_records(manifest);
    for (size_t i = 1; i < manifest.tensors.size(); ++i) {
      if (manifest.tensors[i].name == manifest.tensors[i - 1].name) {
        pieced.insert(manifest.tensors[i].name);
      }
    }
    for (size_t i = 0; i < manifest.files.size(); ++i)
      file_index.emplace(manifest.files[i].name, i);
    maps.resize(manifest.files.size());
  }

  const Mapping& mapping(const std::string& file) const {
    const size_t i = file_index.at(file);
    std::lock_guard<std::mutex> lock(mu);
    if (maps[i]) return *maps[i];
    auto m = std::make_unique<Mapping>();
    try {
      m->reader = std::make_unique<restore::ShardReader>(dir, manifest.files[i], manifest);
    } catch (const Error& e) {
      if (!restore::lost_to_overwrite(e, dir)) throw;
      throw_error(e.code(), std::string(e.what()) +
                                " (the snapshot was overwritten after it was opened: open it again)",
                  e.sys_errno());
    }
    const uint64_t size = m->reader->file().size;
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, m->reader->fd(), 0);
    if (p == MAP_FAILED) detail::throw_sys_error(-errno, "mmap " + m->reader->path());
    m->base = static_cast<uint8_t*>(p);
    m->verified.reset(new std::atomic<bool>[manifest.files[i].chunk_hashes.size()]());
    maps[i] = std::move(m);
    return *maps[i];
  }

  // Hashes the not yet verified chunks under [begin, end) of the mapped file.
  void verify_range(const Mapping& m, uint64_t begin, uint64_t end) const {
    const uint64_t cb = m.reader->file().chunk_bytes;
    for (uint64_t c = begin / cb; c <= (end - 1) / cb; ++c) {
      if (m.verified[c].load(std::memory_order_acquire)) continue;
      if (!m.reader->chunk_ok(c, m.base + c * cb, m.reader->chunk_length(c))) {
        m.reader->throw_hash_mismatch(c);
      }
      m.verified[c].store(true, std::memory_order_release);
    }
  }
};

const Manifest& SnapshotReader::manifest() const { return impl_->manifest; }

std::vector<std::string> SnapshotReader::keys() const {
  std::vector<std::string> out;
  out.reserve(impl_->manifest.tensors.size());
  for (const TensorRecord& t : impl_->manifest.tensors) {
    if (out.empty() || out.back() != t.name) out.push_back(t.name);
  }
  return out;
}

bool SnapshotReader::contains(const std::string& key) const { return impl_->index.count(key) != 0; }

const TensorRecord& SnapshotReader::record(const std::string& key) const {
  const auto it = impl_->index.find(key);
  if (it == impl_->index.end()) {
    throw_error(ErrorCode::kKeyNotFound,
                "key '" + key + "' is not in snapshot " + impl_->dir.path.string());
  }
  if (impl_->pieced.count(key) != 0) {
    throw_error(ErrorCode::kUnsupported,
                "tensor '" + key + "' of " + impl_->dir.path.string() +
                    " is stored as several pieces (a distributed save); read it with "
                    "tsnap::load or load_into");
  }
  return *it->second;
}

at::Tensor SnapshotReader::read(const std::string& key) const {
  const TensorRecord& r = record(key);
  return view(r, r.begin, r.end, r.shape);
}

at::Tensor SnapshotReader::read_rows(const std::string& key, int64_t start, int64_t length) const {
  const TensorRecord& r = record(key);
  if (r.shape.empty()) {
    throw_error(ErrorCode::kInvalidArgument,
                "tensor '" + key + "' is 0-d: it has no rows to slice");
  }
  const int64_t rows = r.shape[0];
  if (start < 0 || length < 0 || start > rows || length > rows - start) {
    throw_error(ErrorCode::kInvalidArgument, "rows [" + std::to_string(start) + ", " +
                                                 std::to_string(start) + " + " +
                                                 std::to_string(length) + ") are outside tensor '" +
                                                 key + "' of " + std::to_string(rows) + " rows");
  }
  const uint64_t row_bytes = rows == 0 ? 0 : r.nbytes() / static_cast<uint64_t>(rows);
  std::vector<int64_t> shape = r.shape;
  shape[0] = length;
  const uint64_t begin = r.begin + static_cast<uint64_t>(start) * row_bytes;
  return view(r, begin, begin + static_cast<uint64_t>(length) * row_bytes, std::move(shape));
}

at::Tensor SnapshotReader::view(const TensorRecord& r, uint64_t begin, uint64_t end,
                                std::vector<int64_t> shape) const {
  const at::TensorOptions options = at::TensorOptions().dtype(r.dtype);
  if (begin == end) return at::empty(shape, options);
  const Mapping& m = impl_->mapping(r.file);
  if (impl_->options.verify) impl_->verify_range(m, begin, end);
  std::shared_ptr<const Impl> keep = impl_;
  return at::from_blob(
      m.base + begin, shape, [keep](void*) {}, options);
}

SnapshotReader open(const std::filesystem::path& path, const OpenOptions& options) {
  if (format::is_s3(path)) {
    // The reader maps its files on first use: the local copy lives as long as it does.
    auto fetched = std::make_shared<const restore::FetchedSnapshot>(path.native());
    auto impl = std::make_shared<SnapshotReader::Impl>(
        format::SnapshotDir::open(fetched->path()), options);
    impl->fetched = std::move(fetched);
    return SnapshotReader(std::move(impl));
  }
  return restore::read_snapshot(path, [&](const format::SnapshotDir& dir) {
    return SnapshotReader(std::make_shared<const SnapshotReader::Impl>(dir, options));
  });
}

}  // namespace tsnap
