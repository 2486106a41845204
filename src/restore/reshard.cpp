#include "restore/reshard.h"

#include <algorithm>

namespace tsnap::restore {

Box box_of(const TensorRecord& r) {
  if (r.shard) return {r.shard->offsets, r.shape};
  return {std::vector<int64_t>(r.shape.size(), 0), r.shape};
}

const std::vector<int64_t>& global_shape_of(const TensorRecord& r) {
  return r.shard ? r.shard->global_shape : r.shape;
}

std::vector<Run> overlap_runs(const Box& from, const Box& to) {
  const size_t dims = from.shape.size();
  std::vector<int64_t> lo(dims), hi(dims);
  for (size_t d = 0; d < dims; ++d) {
    lo[d] = std::max(from.offsets[d], to.offsets[d]);
    hi[d] = std::min(from.offsets[d] + from.shape[d], to.offsets[d] + to.shape[d]);
    if (lo[d] >= hi[d]) return {};
  }
  if (dims == 0) return {{0, 0, 1}};
  // Merge trailing dimensions that both boxes (and so the overlap) span fully.
  const auto full = [&](size_t d) {
    return lo[d] == from.offsets[d] && hi[d] == from.offsets[d] + from.shape[d] &&
           lo[d] == to.offsets[d] && hi[d] == to.offsets[d] + to.shape[d];
  };
  size_t k = dims - 1;
  uint64_t run = static_cast<uint64_t>(hi[k] - lo[k]);
  while (k > 0 && full(k)) {
    --k;
    run *= static_cast<uint64_t>(hi[k] - lo[k]);
  }
  // Row-major element strides of both boxes.
  std::vector<uint64_t> from_stride(dims, 1), to_stride(dims, 1);
  for (size_t d = dims - 1; d > 0; --d) {
    from_stride[d - 1] = from_stride[d] * static_cast<uint64_t>(from.shape[d]);
    to_stride[d - 1] = to_stride[d] * static_cast<uint64_t>(to.shape[d]);
  }
  // Odometer over dimensions [0, k) of the overlap; dimension k starts at lo[k], the rest at lo.
  std::vector<int64_t> idx(lo.begin(), lo.begin() + static_cast<std::ptrdiff_t>(k));
  std::vector<Run> runs;
  for (;;) {
    uint64_t src = 0, dst = 0;
    for (size_t d = 0; d < dims; ++d) {
      const int64_t i = d < k ? idx[d] : lo[d];
      src += static_cast<uint64_t>(i - from.offsets[d]) * from_stride[d];
      dst += static_cast<uint64_t>(i - to.offsets[d]) * to_stride[d];
    }
    runs.push_back({src, dst, run});
    size_t d = k;
    while (d > 0) {
      --d;
      if (++idx[d] < hi[d]) break;
      idx[d] = lo[d];
      if (d == 0) return runs;
    }
    if (k == 0) return runs;
  }
}

}  // namespace tsnap::restore
