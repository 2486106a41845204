#include "plan/plan.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "common/shape.h"
#include "format/dtype.h"
#include "format/safetensors.h"
#include "tsnap/error.h"

namespace tsnap::plan {
namespace {

constexpr uint64_t kAutoShardBytes = 1ull << 30;

std::string shard_name(size_t i, size_t n, RankOf ranks) {
  char buf[96];
  if (ranks.world_size > 1) {
    std::snprintf(buf, sizeof buf, "rank-%05d-shard-%05zu-of-%05zu.safetensors", ranks.rank, i, n);
  } else {
    std::snprintf(buf, sizeof buf, "shard-%05zu-of-%05zu.safetensors", i, n);
  }
  return buf;
}

uint64_t stored_nbytes(const at::Tensor& t, at::ScalarType dtype) {
  return static_cast<uint64_t>(t.numel()) * format::element_size(dtype);
}

// A rank's piece must lie inside the global tensor it belongs to.
void check_shard(const std::string& key, const at::Tensor& t, const ShardSpec& shard) {
  const auto dims = static_cast<size_t>(t.dim());
  bool ok = shard.global_shape.size() == dims && shard.offsets.size() == dims;
  for (size_t d = 0; ok && d < dims; ++d) {
    ok = shard.offsets[d] >= 0 && shard.global_shape[d] >= 0 &&
         shard.offsets[d] <= shard.global_shape[d] &&
         t.size(static_cast<int64_t>(d)) <= shard.global_shape[d] - shard.offsets[d];
  }
  if (!ok) {
    throw_error(ErrorCode::kInvalidArgument,
                "tensor '" + key + "': its shard spec (global shape " +
                    detail::shape_string(shard.global_shape) + ", offsets " +
                    detail::shape_string(shard.offsets) + ") does not contain a piece of shape " +
                    detail::shape_string(t.sizes()));
  }
}

struct Item {
  const std::string* key;
  const StateEntry* entry;
  at::ScalarType dtype;
  uint64_t bytes;
};

// Largest first, then by key: the order both balancing steps use.
bool heavier(const Item& a, const Item& b) {
  return a.bytes != b.bytes ? a.bytes > b.bytes : *a.key < *b.key;
}

// What `ranks.rank` writes: its pieces, and the replicated items that a greedy balance of the
// replicated bytes over the ranks gives it (every rank computes the same assignment from the
// same key set). `*replicated` gets every replicated item as "key dtype shape".
std::vector<Item> share_of(const std::vector<Item>& items, RankOf ranks,
                           std::vector<std::string>* replicated) {
  std::vector<Item> mine, shared;
  for (const Item& it : items) (it.entry->shard ? mine : shared).push_back(it);
  std::stable_sort(shared.begin(), shared.end(), heavier);
  std::vector<uint64_t> load(static_cast<size_t>(ranks.world_size), 0);
  for (const Item& it : shared) {
    const size_t r = std::min_element(load.begin(), load.end()) - load.begin();
    load[r] += it.bytes;
    if (static_cast<int>(r) == ranks.rank) mine.push_back(it);
    replicated->push_back(*it.key + " " + std::string(format::dtype_name(it.dtype)) + " " +
                          detail::shape_string(it.entry->tensor.sizes()));
  }
  std::sort(replicated->begin(), replicated->end());
  return mine;
}

}  // namespace

at::ScalarType stored_dtype(const std::string& key, const StateEntry& entry,
                            const SaveOptions& options) {
  const at::ScalarType src = entry.tensor.scalar_type();
  if (!format::is_supported(src)) {
    throw_error(
        ErrorCode::kInvalidArgument,
        "tensor '" + key + "' has dtype " + c10::toString(src) + ", which format v1 cannot store");
  }
  std::optional<at::ScalarType> want = entry.dtype ? entry.dtype : options.dtype;
  if (!want || !format::is_floating(src)) return src;
  if (!format::is_floating(*want)) {
    throw_error(ErrorCode::kInvalidArgument,
                "tensor '" + key + "': cannot store a floating tensor as " + c10::toString(*want) +
                    " (choose f64, f32, f16 or bf16)");
  }
  return *want;
}

Plan make_plan(const StateDict& state, const SaveOptions& options, uint64_t chunk_bytes,
               const std::string& id, int max_auto_shards, RankOf ranks) {
  if (ranks.world_size < 1 || ranks.rank < 0 || ranks.rank >= ranks.world_size) {
    throw_error(ErrorCode::kInvalidArgument, "rank " + std::to_string(ranks.rank) +
                                                 " is not in a world of " +
                                                 std::to_string(ranks.world_size));
  }
  if (chunk_bytes == 0 || chunk_bytes % format::kAlignment != 0 ||
      chunk_bytes > format::kMaxChunkBytes) {
    throw_error(ErrorCode::kInvalidArgument, "chunk size " + std::to_string(chunk_bytes) +
                                                 " is not a positive multiple of 4096 up to " +
                                                 std::to_string(format::kMaxChunkBytes));
  }
  if (options.num_shards < 0) {
    throw_error(ErrorCode::kInvalidArgument, "num_shards must be >= 0");
  }

  // Validate and size every tensor.
  std::vector<Item> items;
  items.reserve(state.size());
  uint64_t tensor_bytes = 0;
  for (const auto& [key, entry] : state) {
    const at::Tensor& t = entry.tensor;
    if (!t.defined()) {
      throw_error(ErrorCode::kInvalidArgument, "tensor '" + key + "' is undefined");
    }
    if (t.layout() != at::kStrided || t.is_quantized()) {
      throw_error(ErrorCode::kInvalidArgument,
                  "tensor '" + key + "' is sparse or quantized; save it dense");
    }
    if (t.is_meta()) {
      throw_error(ErrorCode::kInvalidArgument,
                  "tensor '" + key + "' is on the meta device and has no data to save");
    }
    if (static_cast<size_t>(t.dim()) > format::kMaxDims) {
      throw_error(ErrorCode::kInvalidArgument,
                  "tensor '" + key + "' has " + std::to_string(t.dim()) +
                      " dimensions, more than the format's " + std::to_string(format::kMaxDims));
    }
    if (entry.shard) check_shard(key, t, *entry.shard);
    const at::ScalarType dtype = stored_dtype(key, entry, options);
    items.push_back({&key, &entry, dtype, stored_nbytes(t, dtype)});
  }
  std::vector<std::string> replicated;
  if (ranks.world_size > 1) items = share_of(items, ranks, &replicated);
  for (const Item& it : items) tensor_bytes += it.bytes;

  size_t nfiles = options.num_shards > 0
                      ? static_cast<size_t>(options.num_shards)
                      : static_cast<size_t>(std::clamp<uint64_t>(tensor_bytes / kAutoShardBytes + 1,
                                                                 1, std::max(1, max_auto_shards)));
  nfiles = std::max<size_t>(1, std::min(nfiles, std::max<size_t>(1, items.size())));

  // Greedy balance: largest tensor first, onto the lightest file.
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return heavier(items[a], items[b]); });
  std::vector<std::vector<size_t>> members(nfiles);
  std::vector<uint64_t> load(nfiles, 0);
  for (size_t i : order) {
    const size_t f = std::min_element(load.begin(), load.end()) - load.begin();
    members[f].push_back(i);
    load[f] += items[i].bytes;
  }

  Plan plan;
  plan.id = id;
  plan.tensor_bytes = tensor_bytes;
  plan.num_tensors = items.size();
  plan.replicated = std::move(replicated);
  plan.files.resize(nfiles);
  for (size_t f = 0; f < nfiles; ++f) {
    PlannedFile& file = plan.files[f];
    file.name = shard_name(f, nfiles, ranks);
    file.chunk_bytes = chunk_bytes;
    // Element size descending, then name: every tensor lands naturally aligned.
    std::sort(members[f].begin(), members[f].end(), [&](size_t a, size_t b) {
      const size_t ea = format::element_size(items[a].dtype);
      const size_t eb = format::element_size(items[b].dtype);
      return ea != eb ? ea > eb : *items[a].key < *items[b].key;
    });
    std::vector<format::HeaderTensor> header_tensors;
    uint64_t offset = 0;
    for (size_t i : members[f]) {
      const Item& it = items[i];
      PlannedTensor pt;
      pt.name = *it.key;
      pt.source = it.entry->tensor;
      pt.dtype = it.dtype;
      pt.source_dtype = it.entry->tensor.scalar_type();
      pt.shape = it.entry->tensor.sizes().vec();
      pt.shard = it.entry->shard;
      pt.begin = offset;
      pt.end = offset + it.bytes;
      offset = pt.end;
      header_tensors.push_back({pt.name, pt.dtype, pt.shape, pt.begin, pt.end});
      file.tensors.push_back(std::move(pt));
    }
    file.header = format::build_header(header_tensors, {{"format", "pt"}, {"tsnap_id", id}});
    file.data_offset = file.header.size();
    for (PlannedTensor& pt : file.tensors) {
      pt.begin += file.data_offset;
      pt.end += file.data_offset;
    }
    file.size = file.data_offset + offset;
    plan.total_bytes += file.size;
  }

  // Interleave chunks across files so that every file is written concurrently.
  uint64_t max_chunks = 0;
  for (const PlannedFile& file : plan.files) max_chunks = std::max(max_chunks, file.num_chunks());
  for (uint64_t c = 0; c < max_chunks; ++c) {
    for (uint32_t f = 0; f < plan.files.size(); ++f) {
      if (c < plan.files[f].num_chunks()) plan.chunks.push_back({f, c});
    }
  }
  return plan;
}

}  // namespace tsnap::plan
