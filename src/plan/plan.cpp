#include "plan/plan.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <set>

#include "common/glob.h"
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

// The tensors of a large state are seldom in cache when a save starts (the training has run
// over gigabytes since the last), and each check below waits for a TensorImpl: fetching the
// ones a few entries ahead overlaps those waits (10,000 tensors: 2.0 ms -> 0.8 ms).
constexpr size_t kPrefetchAhead = 8;

void prefetch_impl(const at::Tensor& t) {
  const auto* impl = reinterpret_cast<const char*>(t.unsafeGetTensorImpl());
  if (impl == nullptr) return;
  for (int line = 0; line < 3; ++line) __builtin_prefetch(impl + 64 * line);
}

// Largest first, then by key: the order both balancing steps use.
bool heavier(const Item& a, const Item& b) {
  return a.bytes != b.bytes ? a.bytes > b.bytes : *a.key < *b.key;
}

// The tensors of one file to be, before their offsets are known.
struct Group {
  std::vector<size_t> members;       // indexes into the items
  std::string name;                  // empty: named after its position (name_groups)
  const FileRecord* base = nullptr;  // incremental: the base file whose layout it repeats
  std::string header_id;             // that file's header id (empty: the plan's)
  std::map<std::string, std::pair<uint64_t, uint64_t>> base_offsets;  // name -> [begin, end)
  bool stable = false;  // its members were unchanged in the previous save
};

std::string replicated_entry(const Item& it) {
  return *it.key + " " + std::string(format::dtype_name(it.dtype)) + " " +
         detail::shape_string(it.entry->tensor.sizes());
}

// Names the groups without a name shard-i-of-n (rank-r-shard-... when distributed), skipping
// the names that kept files already have.
void name_groups(std::vector<Group>& groups, RankOf ranks) {
  std::set<std::string> taken;
  for (const Group& g : groups) {
    if (!g.name.empty()) taken.insert(g.name);
  }
  size_t next = 0;
  for (Group& g : groups) {
    if (!g.name.empty()) continue;
    do {
      g.name = shard_name(next++, groups.size(), ranks);
    } while (taken.count(g.name) != 0);
  }
}

// The default layout. Distributed: this rank's pieces, and the replicated items that a greedy
// balance of the replicated bytes over the ranks gives it (every rank computes the same
// assignment from the same key set); then files balanced by bytes, largest tensor first onto
// the lightest file.
std::vector<Group> balanced_groups(const std::vector<Item>& items, const SaveOptions& options,
                                   RankOf ranks, int max_auto_shards,
                                   std::vector<std::string>* replicated) {
  std::vector<size_t> mine, shared;
  for (size_t i = 0; i < items.size(); ++i) {
    (ranks.world_size == 1 || items[i].entry->shard ? mine : shared).push_back(i);
  }
  const auto by_weight = [&](size_t a, size_t b) { return heavier(items[a], items[b]); };
  std::stable_sort(shared.begin(), shared.end(), by_weight);
  std::vector<uint64_t> rank_load(static_cast<size_t>(ranks.world_size), 0);
  for (size_t i : shared) {
    const size_t r = std::min_element(rank_load.begin(), rank_load.end()) - rank_load.begin();
    rank_load[r] += items[i].bytes;
    if (static_cast<int>(r) == ranks.rank) mine.push_back(i);
    replicated->push_back(replicated_entry(items[i]));
  }
  std::sort(replicated->begin(), replicated->end());

  uint64_t bytes = 0;
  for (size_t i : mine) bytes += items[i].bytes;
  size_t nfiles = options.num_shards > 0
                      ? static_cast<size_t>(options.num_shards)
                      : static_cast<size_t>(std::clamp<uint64_t>(bytes / kAutoShardBytes + 1, 1,
                                                                 std::max(1, max_auto_shards)));
  nfiles = std::max<size_t>(1, std::min(nfiles, std::max<size_t>(1, mine.size())));
  std::stable_sort(mine.begin(), mine.end(), by_weight);
  std::vector<Group> groups(nfiles);
  std::vector<uint64_t> load(nfiles, 0);
  for (size_t i : mine) {
    const size_t f = std::min_element(load.begin(), load.end()) - load.begin();
    groups[f].members.push_back(i);
    load[f] += items[i].bytes;
  }
  name_groups(groups, ranks);
  return groups;
}

// Whether `items[i]` is the tensor that base record `t` describes (same stored dtype, shape
// and shard spec).
bool same_tensor(const Item& it, const TensorRecord& t) {
  return it.dtype == t.dtype && it.entry->tensor.sizes().vec() == t.shape &&
         it.entry->shard == t.shard;
}

// The incremental layout (Layout). First the base's files that can be kept whole: every tensor
// still there alike, and not a mix of pieces and replicated entries (a file of replicated
// entries is kept by the rank that wrote it, which every rank can tell from the manifest; a
// file of pieces only by its own rank). Then the rest, by key name, in files of about
// kIncrementalFileChunks chunks: this rank's pieces, and groups of replicated entries given to the
// least loaded rank (counting kept files), in the same order on every rank.
std::vector<Group> incremental_groups(const std::vector<Item>& items, RankOf ranks,
                                      uint64_t chunk_bytes, const Base* base,
                                      const std::set<std::string>* unchanged,
                                      std::vector<std::string>* replicated) {
  // Whether item i is known unchanged; nullopt where the split does not apply (no history, or
  // a replicated entry of a distributed save, whose files every rank must lay out alike).
  auto stable_of = [&](size_t i) -> std::optional<bool> {
    if (unchanged == nullptr || (ranks.world_size > 1 && !items[i].entry->shard)) {
      return std::nullopt;
    }
    return unchanged->count(*items[i].key) != 0;
  };
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < items.size(); ++i) {
    index.emplace(*items[i].key, i);
    if (ranks.world_size > 1 && !items[i].entry->shard) {
      replicated->push_back(replicated_entry(items[i]));
    }
  }
  std::sort(replicated->begin(), replicated->end());
  const uint64_t target = kIncrementalFileChunks * chunk_bytes;
  std::vector<bool> placed(items.size(), false);
  std::vector<uint64_t> rank_load(static_cast<size_t>(ranks.world_size), 0);
  std::vector<Group> groups;
  if (base != nullptr && base->manifest.world_size == ranks.world_size) {
    std::map<std::string, std::vector<const TensorRecord*>> in_file;
    for (const TensorRecord& t : base->manifest.tensors) in_file[t.file].push_back(&t);
    for (const FileRecord& f : base->manifest.files) {
      const auto recs = in_file.find(f.name);
      // Only files this layout would make (one tensor, or at most the target size): a file
      // of the default layout (about 1 GiB, balanced by size) is regrouped by name once.
      if (f.chunk_bytes != chunk_bytes || recs == in_file.end() ||
          (recs->second.size() > 1 && f.size - f.data_offset > target)) {
        continue;
      }
      const bool pieces = recs->second.front()->shard.has_value();
      if (pieces && f.rank != ranks.rank) continue;
      Group g;
      g.name = f.name;
      g.base = &f;
      g.header_id = f.header_id(base->manifest.id);
      bool keep = true;
      uint64_t bytes = 0;
      std::set<bool> classes;  // stable and changing members do not share a kept file
      for (const TensorRecord* t : recs->second) {
        const auto it = index.find(t->name);
        keep = keep && t->shard.has_value() == pieces && it != index.end() && !placed[it->second] &&
               same_tensor(items[it->second], *t);
        if (!keep) break;
        if (const std::optional<bool> stable = stable_of(it->second)) classes.insert(*stable);
        g.members.push_back(it->second);
        g.base_offsets[t->name] = {t->begin, t->end};
        bytes += items[it->second].bytes;
      }
      if (!keep || classes.size() > 1) continue;
      g.stable = classes.count(true) != 0;
      for (size_t i : g.members) placed[i] = true;
      if (!pieces) rank_load[static_cast<size_t>(f.rank)] += bytes;
      if (pieces || f.rank == ranks.rank) groups.push_back(std::move(g));
    }
  }
  // The rest by name (the index is ordered), cut into files of about the target size; the
  // tensors known unchanged apart from the others.
  for (const bool pieces : {false, true})
    for (const bool stable : {false, true}) {
      std::vector<std::vector<size_t>> cut;
      uint64_t size = 0;
      for (const auto& [key, i] : index) {
        if (placed[i] || items[i].entry->shard.has_value() != pieces) continue;
        if (stable_of(i).value_or(false) != stable) continue;
        if (cut.empty() || (size > 0 && size + items[i].bytes > target)) {
          cut.emplace_back();
          size = 0;
        }
        cut.back().push_back(i);
        size += items[i].bytes;
      }
      for (std::vector<size_t>& members : cut) {
        size_t owner = static_cast<size_t>(ranks.rank);
        if (!pieces && ranks.world_size > 1) {
          uint64_t bytes = 0;
          for (size_t i : members) bytes += items[i].bytes;
          owner = std::min_element(rank_load.begin(), rank_load.end()) - rank_load.begin();
          rank_load[owner] += bytes;
        }
        if (static_cast<int>(owner) != ranks.rank) continue;
        Group g;
        g.members = std::move(members);
        g.stable = stable;
        groups.push_back(std::move(g));
      }
    }
  if (groups.empty()) groups.emplace_back();  // an empty state still gets its one file
  name_groups(groups, ranks);
  return groups;
}

// One file's byte image from its group: element size descending, then name, so that every
// tensor lands naturally aligned; the header carries `header_id`.
// `entries`, when given, gets each member's place (file `file_index`) at its item's index.
PlannedFile build_file(const Group& group, const std::vector<Item>& items, uint64_t chunk_bytes,
                       const std::string& header_id, uint32_t file_index = 0,
                       std::vector<TensorRef>* entries = nullptr) {
  std::vector<size_t> members = group.members;
  std::sort(members.begin(), members.end(), [&](size_t a, size_t b) {
    const size_t ea = format::element_size(items[a].dtype);
    const size_t eb = format::element_size(items[b].dtype);
    return ea != eb ? ea > eb : *items[a].key < *items[b].key;
  });
  PlannedFile file;
  file.name = group.name;
  file.chunk_bytes = chunk_bytes;
  file.header_id = header_id;
  std::vector<format::HeaderTensor> header_tensors;
  uint64_t offset = 0;
  for (size_t i : members) {
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
    if (entries != nullptr) {
      (*entries)[i] = {file_index, static_cast<uint32_t>(file.tensors.size())};
    }
    file.tensors.push_back(std::move(pt));
  }
  file.header = format::build_header(header_tensors, {{"format", "pt"}, {"tsnap_id", header_id}});
  file.data_offset = file.header.size();
  for (PlannedTensor& pt : file.tensors) {
    pt.begin += file.data_offset;
    pt.end += file.data_offset;
  }
  file.size = file.data_offset + offset;
  return file;
}

// Whether `file` has exactly the size and offsets of the base file it was grouped after.
bool same_layout(const PlannedFile& file, const FileRecord& base,
                 const std::map<std::string, std::pair<uint64_t, uint64_t>>& base_offsets) {
  if (file.size != base.size || file.data_offset != base.data_offset) return false;
  for (const PlannedTensor& t : file.tensors) {
    const auto it = base_offsets.find(t.name);
    if (it == base_offsets.end() || it->second != std::make_pair(t.begin, t.end)) return false;
  }
  return true;
}

// Appends the chunks of files [first, end) to plan.chunks, interleaved across those files so
// that every file is written concurrently.
void add_chunks(Plan& plan, size_t first) {
  uint64_t max_chunks = 0;
  for (size_t f = first; f < plan.files.size(); ++f) {
    max_chunks = std::max(max_chunks, plan.files[f].num_chunks());
  }
  for (uint64_t c = 0; c < max_chunks; ++c) {
    for (size_t f = first; f < plan.files.size(); ++f) {
      if (c < plan.files[f].num_chunks()) plan.chunks.push_back({static_cast<uint32_t>(f), c});
    }
  }
}

constexpr uint32_t kNotPlaced = UINT32_MAX;

// Layout::previous: `previous`, moved from, with the tensors of `items` (in the state's order)
// as its sources and `id` in its headers, when make_plan would lay them out alike (the same
// keys, stored and source dtypes, shapes and shard specs, and the same inputs that choose the
// files); nullopt, with `previous` untouched, otherwise.
std::optional<Plan> reuse(Plan& previous, const std::vector<Item>& items,
                          const SaveOptions& options, uint64_t chunk_bytes, const std::string& id,
                          int max_auto_shards, RankOf ranks) {
  if (previous.entries.size() != items.size() || previous.chunk_bytes != chunk_bytes ||
      previous.num_shards != options.num_shards || previous.max_auto_shards != max_auto_shards ||
      previous.ranks.rank != ranks.rank || previous.ranks.world_size != ranks.world_size ||
      previous.written_files != previous.files.size() || previous.id.size() != id.size()) {
    return std::nullopt;
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const TensorRef r = previous.entries[i];
    const PlannedTensor& t = previous.files[r.file].tensors[r.index];
    const Item& it = items[i];
    const at::Tensor& src = it.entry->tensor;
    if (t.name != *it.key || t.dtype != it.dtype || t.source_dtype != src.scalar_type() ||
        !std::equal(t.shape.begin(), t.shape.end(), src.sizes().begin(), src.sizes().end()) ||
        !(t.shard == it.entry->shard)) {
      return std::nullopt;
    }
  }
  // Each header names the plan's id once, in its metadata (written first, keys sorted).
  const std::string old_id = "\"tsnap_id\":\"" + previous.id + "\"";
  std::vector<size_t> id_at;
  for (const PlannedFile& f : previous.files) {
    const size_t at = f.header.find(old_id);
    if (f.header_id != previous.id || at == std::string::npos) return std::nullopt;
    id_at.push_back(at + old_id.size() - 1 - id.size());
  }
  Plan plan = std::move(previous);
  previous.entries.clear();  // the mark of a plan moved from
  plan.id = id;
  plan.reused = true;
  for (size_t f = 0; f < plan.files.size(); ++f) {
    plan.files[f].header.replace(id_at[f], id.size(), id);
    plan.files[f].header_id = id;
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const TensorRef r = plan.entries[i];
    plan.files[r.file].tensors[r.index].source = items[i].entry->tensor;
  }
  return plan;
}

}  // namespace

bool is_counter(const std::string& key, const at::Tensor& t) {
  if (t.dim() == 0 || t.numel() == 1) return true;
  const size_t slash = key.find_last_of("/.");
  return std::string_view(key).substr(slash == std::string::npos ? 0 : slash + 1) == "step";
}

void check_dtype_rules(const StateDict& state, const SaveOptions& options) {
  // What is asked must be a floating dtype, whether or not a tensor of this state takes it.
  if (options.dtype && !format::is_floating(*options.dtype)) {
    throw_error(ErrorCode::kInvalidArgument,
                std::string("SaveOptions::dtype must be floating (f64, f32, f16 or bf16), not ") +
                    c10::toString(*options.dtype));
  }
  for (const DtypeRule& rule : options.dtype_rules) {
    if (rule.dtype && !format::is_floating(*rule.dtype)) {
      throw_error(ErrorCode::kInvalidArgument,
                  "dtype rule {\"" + format::printable(rule.pattern) + "\", " +
                      c10::toString(*rule.dtype) +
                      "}: a rule stores floating tensors as f64, f32, f16 or bf16");
    }
  }
  for (const DtypeRule& rule : options.dtype_rules) {
    if (!rule.dtype) continue;
    const std::string* kept = nullptr;
    bool applies = false;
    for (const auto& [key, entry] : state) {
      if (entry.dtype || !detail::glob_match(rule.pattern, key)) continue;
      const at::Tensor& t = entry.tensor;
      if (t.defined() && format::is_floating(t.scalar_type()) && !is_counter(key, t)) {
        applies = true;
        break;
      }
      if (!kept) kept = &key;
    }
    if (!applies && kept) {
      throw_error(
          ErrorCode::kInvalidArgument,
          "dtype rule {\"" + format::printable(rule.pattern) + "\", " + c10::toString(*rule.dtype) +
              "} matches only keys the precision rule keeps " +
              "in their own dtype (counters, one-element scalars, integer and bool tensors), " +
              "e.g. '" + format::printable(*kept) + "'; to convert one, give " +
              "its StateEntry a dtype");
    }
  }
}

at::ScalarType stored_dtype(const std::string& key, const StateEntry& entry,
                            const SaveOptions& options) {
  const at::ScalarType src = entry.tensor.scalar_type();
  if (!format::is_supported(src)) {
    throw_error(
        ErrorCode::kInvalidArgument,
        "tensor '" + key + "' has dtype " + c10::toString(src) + ", which format v1 cannot store");
  }
  std::optional<at::ScalarType> want = entry.dtype;
  const char* from = "its entry";
  if (!want) {
    // The precision rule (SaveOptions): counters and scalars keep their dtype.
    if (is_counter(key, entry.tensor)) return src;
    want = options.dtype;
    from = "SaveOptions::dtype";
    for (const DtypeRule& rule : options.dtype_rules) {
      if (detail::glob_match(rule.pattern, key)) {
        want = rule.dtype;
        from = "a dtype rule";
        break;
      }
    }
  }
  if (!want || !format::is_floating(src)) return src;
  if (!format::is_floating(*want)) {
    throw_error(ErrorCode::kInvalidArgument,
                "tensor '" + key + "': cannot store a floating tensor as " + c10::toString(*want) +
                    " (asked by " + from + "; choose f64, f32, f16 or bf16)");
  }
  return *want;
}

Plan make_plan(const StateDict& state, const SaveOptions& options, uint64_t chunk_bytes,
               const std::string& id, int max_auto_shards, RankOf ranks, const Layout& layout) {
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

  check_dtype_rules(state, options);
  // Validate and size every tensor.
  std::vector<Item> items;
  items.reserve(state.size());
  for (const auto& [key, entry] : state) items.push_back({&key, &entry, {}, 0});
  for (size_t i = 0; i < items.size(); ++i) {
    if (i + kPrefetchAhead < items.size()) prefetch_impl(items[i + kPrefetchAhead].entry->tensor);
    const std::string& key = *items[i].key;
    const StateEntry& entry = *items[i].entry;
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
    items[i].dtype = dtype;
    items[i].bytes = stored_nbytes(t, dtype);
  }
  for (Plan* previous : layout.incremental ? std::vector<Plan*>{} : layout.previous) {
    std::optional<Plan> plan =
        reuse(*previous, items, options, chunk_bytes, id, max_auto_shards, ranks);
    if (plan) return std::move(*plan);
  }
  std::vector<std::string> replicated;
  std::vector<Group> groups =
      layout.incremental ? incremental_groups(items, ranks, chunk_bytes, layout.base,
                                              layout.unchanged, &replicated)
                         : balanced_groups(items, options, ranks, max_auto_shards, &replicated);

  Plan plan;
  plan.id = id;
  plan.replicated = std::move(replicated);
  plan.incremental = layout.incremental;
  if (layout.incremental && layout.base != nullptr) {
    plan.base_dir = layout.base->dir;
    plan.base_name = layout.base->name;
  }
  plan.chunk_bytes = chunk_bytes;
  plan.num_shards = options.num_shards;
  plan.max_auto_shards = max_auto_shards;
  plan.ranks = ranks;
  if (!layout.incremental) plan.entries.assign(items.size(), {kNotPlaced, kNotPlaced});
  plan.files.reserve(groups.size());
  for (const Group& group : groups) {
    PlannedFile file = build_file(
        group, items, chunk_bytes, group.header_id.empty() ? id : group.header_id,
        static_cast<uint32_t>(plan.files.size()), layout.incremental ? nullptr : &plan.entries);
    if (group.base != nullptr) {
      if (same_layout(file, *group.base, group.base_offsets)) {
        file.base_hashes = group.base->chunk_hashes;
      } else {  // laid out otherwise by whatever wrote the base: a file of this save's own
        file = build_file(group, items, chunk_bytes, id);
      }
    }
    file.stable = group.stable;
    for (const PlannedTensor& t : file.tensors) plan.tensor_bytes += t.nbytes();
    plan.num_tensors += file.tensors.size();
    plan.total_bytes += file.size;
    plan.files.push_back(std::move(file));
  }

  // A rank's plan lacks the replicated entries other ranks write, whose shapes decide who
  // writes what: only a plan that holds every entry can be reused.
  if (std::any_of(plan.entries.begin(), plan.entries.end(),
                  [](const TensorRef& r) { return r.file == kNotPlaced; })) {
    plan.entries.clear();
  }
  plan.written_files = plan.files.size();
  add_chunks(plan, 0);
  return plan;
}

void clear_sources(Plan& plan) {
  for (PlannedFile& file : plan.files) {
    for (PlannedTensor& t : file.tensors) t.source = at::Tensor();
  }
}

void add_memory_files(Plan& plan, const StateDict& state, const SaveOptions& options,
                      uint64_t chunk_bytes, int max_auto_shards, RankOf ranks) {
  std::set<std::string> written;
  for (size_t f = 0; f < plan.written_files; ++f) {
    for (const PlannedTensor& t : plan.files[f].tensors) written.insert(t.name);
  }
  StateDict others;
  for (const auto& [key, entry] : state) {
    if (!entry.shard && written.count(key) == 0) others.insert(key, entry.tensor, entry.dtype);
  }
  if (others.size() == 0) return;
  Plan memory = make_plan(others, options, chunk_bytes, plan.id, max_auto_shards);
  const size_t first = plan.files.size();
  for (size_t i = 0; i < memory.files.size(); ++i) {
    PlannedFile& file = memory.files[i];
    file.name = "memory-r" + std::to_string(ranks.rank) + "-" + std::to_string(i) + ".safetensors";
    plan.files.push_back(std::move(file));
  }
  add_chunks(plan, first);
}

}  // namespace tsnap::plan
