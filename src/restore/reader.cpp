// The lazy reader: tensors are views of a MappedSnapshot's private (copy-on-write) mappings
// whose deleter keeps the snapshot's state alive.

#include "tsnap/reader.h"

#include <ATen/ATen.h>

#include "common/hidden.h"
#include "restore/mapped_snapshot.h"
#include "tsnap/error.h"

namespace tsnap {

struct TSNAP_HIDDEN SnapshotReader::Impl {
  std::shared_ptr<const restore::MappedSnapshot> mapped;
};

const Manifest& SnapshotReader::manifest() const { return impl_->mapped->manifest(); }

std::vector<std::string> SnapshotReader::keys() const {
  std::vector<std::string> out;
  const Manifest& m = impl_->mapped->manifest();
  out.reserve(m.tensors.size());
  for (const TensorRecord& t : m.tensors) {
    if (out.empty() || out.back() != t.name) out.push_back(t.name);
  }
  return out;
}

bool SnapshotReader::contains(const std::string& key) const {
  return impl_->mapped->find(key) != nullptr;
}

const TensorRecord& SnapshotReader::record(const std::string& key) const {
  const restore::MappedSnapshot& mapped = *impl_->mapped;
  const TensorRecord* r = mapped.find(key);
  if (r == nullptr) {
    throw_error(ErrorCode::kKeyNotFound,
                "key '" + key + "' is not in snapshot " + mapped.path().string());
  }
  if (mapped.pieced(key)) {
    throw_error(ErrorCode::kUnsupported,
                "tensor '" + key + "' of " + mapped.path().string() +
                    " is stored as several pieces (a distributed save); read it with "
                    "tsnap::load or load_into");
  }
  return *r;
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
  // The mapping is private (copy-on-write): the view may be written to.
  void* data = const_cast<uint8_t*>(impl_->mapped->bytes(r, begin, end));
  std::shared_ptr<const Impl> keep = impl_;
  return at::from_blob(
      data, shape, [keep](void*) {}, options);
}

SnapshotReader open(const std::filesystem::path& path, const OpenOptions& options) {
  return SnapshotReader(std::make_shared<const SnapshotReader::Impl>(
      SnapshotReader::Impl{restore::MappedSnapshot::open(path, options.verify)}));
}

}  // namespace tsnap
