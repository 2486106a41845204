#pragma once
// Resharding: which elements of a stored piece of a global tensor land where in a requested
// piece of it. Both are boxes (offsets and shape in the global tensor) stored densely in
// row-major order; their overlap is copied as runs of consecutive elements in both.

#include <cstdint>
#include <vector>

#include "tsnap/manifest.h"

namespace tsnap::restore {

/// A box of a global tensor: `offsets[d]` + [0, `shape[d]`) in each dimension.
struct Box {
  std::vector<int64_t> offsets;
  std::vector<int64_t> shape;
  bool operator==(const Box& o) const { return offsets == o.offsets && shape == o.shape; }
};

/// `n` elements from element `src` of one box to element `dst` of another.
struct Run {
  uint64_t src = 0;
  uint64_t dst = 0;
  uint64_t n = 0;
};

/// The box a stored record covers: its shard's, or the whole tensor's when it has none.
Box box_of(const TensorRecord& r);
/// The global shape of a stored record.
const std::vector<int64_t>& global_shape_of(const TensorRecord& r);

/// The runs that copy the overlap of `from` into `to` (same rank, same global tensor), in
/// ascending order of both; empty when they do not overlap. The trailing dimensions that both
/// boxes span fully are merged, so pieces cut along dimension 0 give a single run.
std::vector<Run> overlap_runs(const Box& from, const Box& to);

}  // namespace tsnap::restore
