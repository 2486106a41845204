#pragma once
// The plan of a save: which tensors go to which shard file, at which byte offsets, in which
// stored dtype, and how each file's byte image is cut into chunks. Made on the caller's thread
// in microseconds to milliseconds; everything after it (stage, write, commit) follows it.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tsnap/manifest.h"
#include "tsnap/save_options.h"
#include "tsnap/state_dict.h"

namespace tsnap::plan {

/// One tensor's place in a shard file.
struct PlannedTensor {
  std::string name;
  at::Tensor source;     ///< The caller's tensor (not copied).
  at::ScalarType dtype;  ///< Stored dtype.
  at::ScalarType source_dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  ///< Absolute offsets in the file.
  uint64_t end = 0;
  std::optional<ShardSpec> shard;
  uint64_t nbytes() const { return end - begin; }
};

/// One shard file's byte image: header bytes, then tensors back to back.
struct PlannedFile {
  std::string name;
  std::string header;  ///< Bytes [0, data_offset): length prefix + padded JSON.
  uint64_t data_offset = 0;
  uint64_t size = 0;  ///< Exact file size.
  uint64_t chunk_bytes = 0;
  std::vector<PlannedTensor> tensors;  ///< In file order (begin ascending).
  /// The save id in the header: the plan's, or for a file that keeps the layout of the base
  /// snapshot's file of the same name (incremental saves), that file's.
  std::string header_id;
  /// Incremental saves: the chunk hashes of the base snapshot's file of the same name, whose
  /// layout (header included) this file repeats byte for byte; a chunk staged with an equal
  /// hash need not be written. Empty: nothing to compare with.
  std::vector<uint64_t> base_hashes;
  /// Incremental saves: made of tensors the previous save found unchanged (Layout::unchanged),
  /// kept apart from those that change.
  bool stable = false;
  uint64_t num_chunks() const { return size == 0 ? 0 : (size + chunk_bytes - 1) / chunk_bytes; }
  /// Byte range [first, last) of chunk `c`.
  uint64_t chunk_begin(uint64_t c) const { return c * chunk_bytes; }
  uint64_t chunk_end(uint64_t c) const { return std::min(size, (c + 1) * chunk_bytes); }
};

/// The committed snapshot an incremental save compares its chunks with.
struct Base {
  std::string dir;   ///< Its directory.
  std::string name;  ///< Its snapshot name (recorded as FileRecord::reused_from).
  Manifest manifest;
};

struct Plan;

/// How the files of a save are chosen.
struct Layout {
  /// Group tensors into files by key name (about kIncrementalFileChunks chunks each, separately for
  /// rank pieces and replicated entries) instead of balancing by size, and keep the files of
  /// `base` whose tensors are all still there with the same dtype, shape and shard spec.
  bool incremental = false;
  const Base* base = nullptr;  ///< Incremental only; may be null (a first save).
  /// Incremental only, may be null: the keys whose bytes the previous incremental save found
  /// unchanged (SaveJob::unchanged_keys). Their tensors go to files of their own, apart from
  /// those that change (a base file is kept only when all its tensors or none are in the set),
  /// so that frozen layers end up in files that later saves link whole, however their keys
  /// interleave with trained ones. In a distributed save, applied to this rank's pieces only
  /// (the replicated entries' files must be the same on every rank).
  const std::set<std::string>* unchanged = nullptr;
  /// Not incremental: plans make_plan made before (for earlier saves of the same training
  /// state), which the caller owns alone while make_plan runs. When the state holds the same
  /// keys as one of them with the same stored dtypes, shapes and shard specs, and chunk size,
  /// shard count and ranks are the same, the first such plan is moved into the result (with
  /// this save's tensors and id) instead of planned again, and left without entries; the others
  /// are not touched. The plan of every periodic save of a training loop but the first costs a
  /// comparison with the state, not a copy of the plan.
  std::vector<Plan*> previous;
};

/// Target size of an incremental save's files, in chunks: 64 MiB with the default 16 MiB
/// chunks (a larger tensor gets a file of its own).
inline constexpr uint64_t kIncrementalFileChunks = 4;

/// A chunk's address: file index and chunk index.
struct ChunkRef {
  uint32_t file = 0;
  uint64_t chunk = 0;
};

/// A tensor's address: file index and index in the file.
struct TensorRef {
  uint32_t file = 0;
  uint32_t index = 0;
};

/// Which rank of how many makes the plan. In a distributed save every rank plans its own files:
/// its pieces (entries with a ShardSpec) and its share of the replicated entries (those
/// without), which every rank assigns alike from the same key set, balanced by bytes.
struct RankOf {
  int rank = 0;
  int world_size = 1;
};

/// The whole plan.
struct Plan {
  std::string id;
  std::vector<PlannedFile> files;
  std::vector<ChunkRef> chunks;  ///< Every chunk of every file, interleaved across files.
  uint64_t total_bytes = 0;      ///< Sum of file sizes.
  uint64_t tensor_bytes = 0;     ///< Sum of stored tensor bytes.
  size_t num_tensors = 0;
  /// Distributed saves: every replicated entry of the state (whichever rank writes it) as
  /// "key dtype shape", sorted, so that rank 0 can check that all ranks hold the same set.
  std::vector<std::string> replicated;
  /// Incremental saves with a base: its directory and name (files with base_hashes repeat
  /// files of the same name there).
  bool incremental = false;  ///< Laid out by Layout::incremental.
  std::string base_dir;
  std::string base_name;
  /// Files [0, written_files) are written; the rest are staged for the hot image only (see
  /// add_memory_files). Their chunks follow the written files' chunks and are not counted in
  /// total_bytes, tensor_bytes or num_tensors.
  size_t written_files = 0;
  /// What the layout was made from, for Layout::previous: the chunk size, shard count and
  /// ranks, and where each entry of the state went (entry i in the state's order is
  /// files[entries[i].file].tensors[entries[i].index]). Empty `entries` for an incremental
  /// plan, which is never reused.
  uint64_t chunk_bytes = 0;
  int num_shards = 0;
  int max_auto_shards = 0;
  RankOf ranks;
  std::vector<TensorRef> entries;
  bool reused = false;  ///< Made from Layout::previous.
};

/// Whether `key` holds a counter or a scalar, which `SaveOptions::dtype` and its rules never
/// convert: a tensor of one element (0-d or not: `global_step` kept in a tensor of shape [1],
/// a loss scale), or a key whose last component ('/' or '.' separated) is `step`.
bool is_counter(const std::string& key, const at::Tensor& t);

/// Throws InvalidArgument for a `SaveOptions::dtype` or `dtype_rules` dtype that is not
/// floating, and for a rule that asks for a dtype but matches only keys the precision rule
/// keeps in their own dtype (counters, scalars, integer and bool tensors), naming the rule and
/// a key: such a rule would be ignored.
void check_dtype_rules(const StateDict& state, const SaveOptions& options);

/// The dtype `entry` is stored as under `options` and the precision rule (integer/bool tensors,
/// counters and scalars never convert unless their entry asks). Throws InvalidArgument naming
/// `key` for an unsupported dtype or a malformed rule pattern.
at::ScalarType stored_dtype(const std::string& key, const StateEntry& entry,
                            const SaveOptions& options);

/// Plans a save of `state`. `chunk_bytes` is a positive multiple of 4096; `num_shards` > 0 or 0
/// for automatic (one file per ~1 GiB, capped by `max_auto_shards`). Tensors are assigned to
/// files greedily by size (largest first to the lightest file) and ordered within a file by
/// element size descending, then name. Errors: InvalidArgument naming the key (undefined tensor,
/// unsupported dtype, sparse/quantized tensor). With `ranks.world_size` > 1 the plan holds only
/// what `ranks.rank` writes (see RankOf) and its files are named after the rank. An incremental
/// `layout` groups files as Layout says; every rank derives the same owner for each replicated
/// entry from the same base manifest. A non-incremental `layout` may name earlier plans to
/// reuse (Layout::previous): the result is the same as planning anew.
Plan make_plan(const StateDict& state, const SaveOptions& options, uint64_t chunk_bytes,
               const std::string& id, int max_auto_shards, RankOf ranks = {},
               const Layout& layout = {});

/// Drops the plan's references to the caller's tensors (PlannedTensor::source): once its save
/// no longer reads them, or before a plan is kept for Layout::previous.
void clear_sources(Plan& plan);

/// Distributed saves with a hot image (SnapshotterOptions::staging.keep_hot): appends to `plan`
/// (this rank's) files that hold the replicated entries of `state` that other ranks write, staged
/// into the image but never written, so that the image holds every entry this rank restores. They
/// are named `memory-r<rank>-<i>.safetensors` (never on disk) and laid out like a single
/// process's files of those entries.
void add_memory_files(Plan& plan, const StateDict& state, const SaveOptions& options,
                      uint64_t chunk_bytes, int max_auto_shards, RankOf ranks);

}  // namespace tsnap::plan
