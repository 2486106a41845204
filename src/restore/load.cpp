#include "tsnap/load.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>

#include "common/glob.h"
#include "common/text_table.h"
#include "format/dtype.h"
#include "format/manifest_io.h"
#include "format/s3_root.h"
#include "format/storage_root.h"
#include "restore/device_destinations.h"
#include "restore/read_chunks.h"
#include "restore/read_hot_chunks.h"
#include "restore/read_plan.h"
#include "restore/read_snapshot.h"
#include "restore/read_store_chunks.h"
#include "stage/hot_image.h"
#include "tsnap/error.h"
#include "tsnap/hot_snapshot.h"

namespace tsnap {
namespace {

// The snapshot's keys, once each (a key stored as pieces has several records).
std::vector<std::string> record_names(const Manifest& m) {
  std::vector<std::string> names;
  names.reserve(m.tensors.size());
  for (const TensorRecord& t : m.tensors) {
    if (names.empty() || names.back() != t.name) names.push_back(t.name);
  }
  return names;
}

// The snapshot's keys under `prefix`, without it (all of them for an empty prefix).
std::vector<std::string> keys_under(const std::vector<std::string>& names,
                                    const std::string& prefix) {
  if (prefix.empty()) return names;
  std::vector<std::string> out;
  for (const std::string& n : names) {
    if (n.size() > prefix.size() && n.compare(0, prefix.size(), prefix) == 0) {
      out.push_back(n.substr(prefix.size()));
    }
  }
  return out;
}

// The keys of `names` (bare, under options.key_prefix) that the patterns select; a pattern that
// matches nothing is an error unless allow_unmatched, and so is a prefix that no key has.
// Checks the key prefix against the snapshot's keys `all`: some key must start with it, and a
// pattern must not (patterns apply to the keys without the prefix).
void check_prefix(const std::vector<std::string>& all, const LoadOptions& options,
                  const std::filesystem::path& path) {
  const std::string& prefix = options.key_prefix;
  if (prefix.empty()) return;
  if (keys_under(all, prefix).empty() && !all.empty()) {
    throw_error(ErrorCode::kKeyNotFound, "no key of " + path.string() +
                                             " starts with the key "
                                             "prefix '" +
                                             prefix + "'" + detail::near_keys_note(prefix, all));
  }
  for (const auto* patterns : {&options.include, &options.exclude}) {
    for (const std::string& p : *patterns) {
      if (p.compare(0, prefix.size(), prefix) == 0) {
        throw_error(ErrorCode::kInvalidArgument, "pattern '" + p +
                                                     "' starts with the key prefix '" + prefix +
                                                     "': patterns apply to the keys without it ('" +
                                                     p.substr(prefix.size()) + "')");
      }
    }
  }
}

std::vector<std::string> select(const std::vector<std::string>& all, const LoadOptions& options,
                                const std::filesystem::path& path) {
  check_prefix(all, options, path);
  return detail::select_keys(keys_under(all, options.key_prefix), options.include, options.exclude,
                             !options.allow_unmatched);
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::string shape_text(at::IntArrayRef shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// Why `dest` cannot take the stored tensor `r` (shape or dtype), or nothing.
std::optional<std::string> mismatch(const TensorRecord& r, const at::Tensor& dest) {
  if (dest.sizes() != at::IntArrayRef(r.shape)) {
    return "shape " + shape_text(r.shape) + " in the snapshot, " + shape_text(dest.sizes()) +
           " in the destination";
  }
  const at::ScalarType to = dest.scalar_type();
  if (to != r.dtype && !(format::is_floating(r.dtype) && format::is_floating(to))) {
    return std::string("dtype ") + c10::toString(r.dtype) +
           " in the snapshot cannot be loaded into " + c10::toString(to) +
           " (only floating dtypes convert)";
  }
  return std::nullopt;
}

// A new tensor for `r`, of `shape`; an allocation failure becomes a tsnap error naming it.
at::Tensor allocate(const TensorRecord& r, const std::vector<int64_t>& shape) {
  try {
    return at::empty(shape, at::TensorOptions().dtype(r.dtype));
  } catch (const std::exception& e) {
    throw_error(ErrorCode::kUnsupported,
                "cannot allocate tensor '" + r.name + "' (" +
                    std::to_string(numel_of(shape) * c10::elementSize(r.dtype)) +
                    " bytes): " + e.what());
  }
}

// Adds the targets that fill the box `want` of key's global tensor `global` from its stored
// `pieces` into `data` (`dtype`, `want` stored densely). Returns why it cannot, or nothing.
std::optional<std::string> add_box_targets(const std::vector<const TensorRecord*>& pieces,
                                           const std::vector<int64_t>& global,
                                           const restore::Box& want, void* data,
                                           at::ScalarType dtype,
                                           std::vector<restore::Target>* targets) {
  const TensorRecord& first = *pieces.front();
  if (want.offsets.size() != global.size() || want.shape.size() != global.size()) {
    return "the destination's ShardSpec has " + std::to_string(global.size()) +
           " dimensions and offsets for " + std::to_string(want.offsets.size()) +
           ", but the tensor has " + std::to_string(want.shape.size());
  }
  const std::vector<int64_t>& stored = restore::global_shape_of(first);
  if (global != stored) {
    return "global shape " + shape_text(stored) + " in the snapshot, " + shape_text(global) +
           " in the destination";
  }
  if (dtype != first.dtype && !(format::is_floating(first.dtype) && format::is_floating(dtype))) {
    return std::string("dtype ") + c10::toString(first.dtype) +
           " in the snapshot cannot be loaded into " + c10::toString(dtype) +
           " (only floating dtypes convert)";
  }
  const size_t mark = targets->size();
  int64_t covered = 0;
  for (const TensorRecord* p : pieces) {
    const restore::Box box = restore::box_of(*p);
    std::vector<restore::Run> runs = restore::overlap_runs(box, want);
    if (runs.empty()) continue;
    for (const restore::Run& r : runs) covered += static_cast<int64_t>(r.n);
    if (box == want) runs.clear();  // the whole piece, in order
    targets->push_back({p, data, dtype, std::move(runs)});
  }
  if (covered != numel_of(want.shape)) {
    targets->resize(mark);
    return "the snapshot's " + std::to_string(pieces.size()) + " pieces hold " +
           std::to_string(covered) + " of the " + std::to_string(numel_of(want.shape)) +
           " elements asked for (offsets " + shape_text(want.offsets) + ", shape " +
           shape_text(want.shape) + ")";
  }
  return std::nullopt;
}

// What a load reads: the manifest, and where the chunks come from (the snapshot's directory,
// or a hot snapshot's staging buffers).
struct Source {
  const Manifest& manifest;
  const std::filesystem::path& path;
  // Opens and checks what the reads of `records` need, before any destination is allocated
  // (null: nothing to open).
  std::function<void(const std::vector<const TensorRecord*>&)> open;
  // Reads `plan` into `targets`.
  std::function<restore::ReadStats(const std::vector<restore::Target>& targets,
                                   const restore::ReadPlan& plan, const LoadOptions& options,
                                   bool in_place)>
      read;
};

// The directory `dir` whose manifest is `m`; `opened` keeps the shards `open` opened.
Source disk_source(const format::SnapshotDir& dir, const Manifest& m,
                   restore::OpenedShards& opened) {
  return {m, dir.path,
          [&dir, &m, &opened](const std::vector<const TensorRecord*>& records) {
            opened = restore::open_shards(dir, m, records);
          },
          [&dir, &m, &opened](const std::vector<restore::Target>& targets,
                              const restore::ReadPlan& plan, const LoadOptions& options,
                              bool in_place) {
            return restore::read_chunks(dir, m, targets, plan, options, in_place, &opened);
          }};
}

// A snapshot behind a storage root other than a directory (object storage): its chunks read
// by ranged reads, straight into the load's buffers.
Source store_source(restore::StoredSnapshot& stored, const std::filesystem::path& path) {
  return {stored.manifest(), path,
          [&stored](const std::vector<const TensorRecord*>& records) {
            std::vector<const FileRecord*> files;
            for (const TensorRecord* r : records) {
              const FileRecord* f = stored.manifest().find_file(r->file);
              if (f != nullptr && std::find(files.begin(), files.end(), f) == files.end()) {
                files.push_back(f);
              }
            }
            stored.check_files(files);
          },
          [&stored](const std::vector<restore::Target>& targets, const restore::ReadPlan& plan,
                    const LoadOptions& options, bool in_place) {
            return restore::read_store_chunks(stored, targets, plan, options, in_place);
          }};
}

// A hot image, pinned by the caller.
Source hot_source(const stage::HotImage& image) {
  return {*image.manifest(), image.path(), nullptr,
          [&image](const std::vector<restore::Target>& targets, const restore::ReadPlan& plan,
                   const LoadOptions& options, bool in_place) {
            return restore::read_hot_chunks(image, targets, plan, options, in_place);
          }};
}

StateDict load_from(const Source& src, const LoadOptions& options) {
  const Manifest& m = src.manifest;
  const restore::PieceIndex index = restore::index_pieces(m);
  const std::vector<std::string> keys = select(record_names(m), options, src.path);
  // A key stored whole (or as the one piece a process saved) comes back as stored, with its
  // ShardSpec; a key stored as pieces is assembled into its global tensor, which they must
  // cover.
  std::vector<restore::Target> targets;
  for (const std::string& k : keys) {
    const std::vector<const TensorRecord*>& pieces = index.at(options.key_prefix + k);
    if (pieces.size() == 1) {
      targets.push_back({pieces[0], nullptr, pieces[0]->dtype, {}});
      continue;
    }
    const std::vector<int64_t>& global = restore::global_shape_of(*pieces[0]);
    const restore::Box whole{std::vector<int64_t>(global.size(), 0), global};
    if (const auto why =
            add_box_targets(pieces, global, whole, nullptr, pieces[0]->dtype, &targets)) {
      throw_error(ErrorCode::kUnsupported, "tensor '" + k + "' cannot be assembled: " + *why +
                                               "; load the pieces you need with load_into "
                                               "and ShardSpec destinations");
    }
  }
  // The manifest's sizes are believed only once the files are there with those sizes: a
  // manifest claiming a 1 TiB tensor over a small shard fails here, before any allocation.
  // The shards stay open for the reads.
  if (src.open) {
    std::vector<const TensorRecord*> records;
    for (const restore::Target& t : targets) records.push_back(t.record);
    src.open(records);
  }
  StateDict result;
  for (size_t i = 0; i < targets.size();) {
    const TensorRecord& r = *targets[i].record;
    const bool whole = targets[i].runs.empty() && index.at(r.name).size() == 1;
    at::Tensor t = allocate(r, whole ? r.shape : restore::global_shape_of(r));
    result.insert(r.name.substr(options.key_prefix.size()), t).shard =
        whole ? r.shard : std::nullopt;
    for (; i < targets.size() && targets[i].record->name == r.name; ++i) {
      targets[i].data = t.data_ptr();
    }
  }
  LoadOptions streaming = options;
  streaming.atomic = false;  // new tensors: a failed load returns nothing anyway
  src.read(targets, restore::plan_reads(m, targets, options.verify), streaming,
           /*in_place=*/false);
  return result;
}

}  // namespace

StateDict load(const std::filesystem::path& path, const LoadOptions& options) {
  if (format::is_s3(path)) {
    const auto [root, name] = format::StorageRoot::of_snapshot(path);
    const Manifest m = root->read_manifest(name);
    restore::StoredSnapshot stored(*root, name, m);
    return load_from(store_source(stored, path), options);
  }
  return restore::read_snapshot(path, [&](const format::SnapshotDir& dir) {
    const Manifest m = format::read_manifest_in(dir);
    restore::OpenedShards opened;
    return load_from(disk_source(dir, m, opened), options);
  });
}

StateDict load(const HotSnapshot& snapshot, const LoadOptions& options) {
  const std::shared_ptr<stage::HotImage> image = detail::HotAccess::pin(snapshot);
  return load_from(hot_source(*image), options);
}

namespace {

LoadReport load_into_from(const Source& src, StateDict& dest, const LoadOptions& options,
                          std::chrono::steady_clock::time_point t0) {
  const std::filesystem::path& path = src.path;
  const Manifest& m = src.manifest;
  const restore::PieceIndex index = restore::index_pieces(m);
  const std::vector<std::string> names = record_names(m);
  check_prefix(names, options, path);
  const std::vector<std::string> keys =
      detail::select_keys(dest.keys(), options.include, options.exclude, !options.allow_unmatched);

  // Every problem is found from the manifest before any destination byte changes.
  std::vector<std::string> missing, mismatched, unusable;
  std::vector<restore::Target> targets;
  // Device destinations: the key and its targets [first, end), which read into a host stand-in.
  struct OnDevice {
    std::string key;
    size_t first, end;
  };
  std::vector<OnDevice> on_device;
  for (const std::string& k : keys) {
    const auto it = index.find(options.key_prefix + k);
    if (it == index.end()) {
      missing.push_back(k);
      continue;
    }
    const StateEntry& e = dest.entry(k);
    const at::Tensor& t = e.tensor;
    const std::vector<const TensorRecord*>& pieces = it->second;
    std::optional<std::string> why;
    if (t.layout() != at::kStrided || !t.is_contiguous() || !t.has_storage() ||
        t.device().is_meta()) {
      unusable.push_back(k);
      continue;
    }
    const size_t first = targets.size();
    if (!e.shard && pieces.size() == 1 && !pieces[0]->shard) {
      // A whole tensor into a whole tensor.
      why = mismatch(*pieces[0], t);
      if (!why) targets.push_back({pieces[0], t.data_ptr(), t.scalar_type(), {}});
    } else if (!e.shard && pieces.size() == 1 && t.sizes() == at::IntArrayRef(pieces[0]->shape)) {
      // The one piece a process saved, into a tensor of its shape.
      why = mismatch(*pieces[0], t);
      if (!why) targets.push_back({pieces[0], t.data_ptr(), t.scalar_type(), {}});
    } else {
      // Resharding: the destination's box of the global tensor (the whole of it without a
      // ShardSpec) from whichever stored pieces overlap it.
      const std::vector<int64_t> shape = t.sizes().vec();
      const restore::Box want{e.shard ? e.shard->offsets : std::vector<int64_t>(shape.size(), 0),
                              shape};
      why = add_box_targets(pieces, e.shard ? e.shard->global_shape : shape, want, t.data_ptr(),
                            t.scalar_type(), &targets);
    }
    if (why) mismatched.push_back(k + ": " + *why);
    if (!why && restore::on_device(t)) on_device.push_back({k, first, targets.size()});
  }
  const std::string where = " (snapshot " + path.string() + "); nothing was written";
  if (!missing.empty()) {
    throw_error(ErrorCode::kKeyNotFound,
                detail::count_of(missing.size(), "destination key is", "destination keys are") +
                    " not in the snapshot: " + join(missing) + where +
                    detail::near_keys_note(options.key_prefix + missing[0], names));
  }
  if (!mismatched.empty()) {
    throw_error(ErrorCode::kShapeMismatch,
                detail::count_of(mismatched.size(), "tensor does", "tensors do") +
                    " not fit its destination: " + join(mismatched) + where);
  }
  if (!unusable.empty()) {
    throw_error(
        ErrorCode::kInvalidArgument,
        "destinations must be contiguous, strided tensors with storage: " + join(unusable) + where);
  }

  LoadReport report;
  for (const std::string& k : detail::select_keys(keys_under(names, options.key_prefix),
                                                  options.include, options.exclude, false)) {
    if (!dest.contains(k)) report.not_in_destination.push_back(k);
  }
  if (options.require_every_key && !report.not_in_destination.empty()) {
    throw_error(ErrorCode::kKeyNotFound, std::to_string(report.not_in_destination.size()) +
                                             " snapshot keys have no destination: " +
                                             join(report.not_in_destination) + where);
  }
  // Device destinations are read into host stand-ins, copied to their devices once every
  // read has succeeded.
  restore::DeviceDestinations devices;
  for (const OnDevice& d : on_device) {
    void* host = devices.stand_in(d.key, dest.entry(d.key).tensor);
    for (size_t i = d.first; i < d.end; ++i) {
      targets[i].data = host;
      targets[i].stand_in = true;
    }
  }
  const restore::ReadStats stats =
      src.read(targets, restore::plan_reads(m, targets, options.verify), options,
               /*in_place=*/true);
  if (!devices.empty()) devices.copy_to_devices();
  report.loaded = keys;
  report.bytes_read = stats.bytes;
  report.engine = stats.engine;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace

LoadReport load_into(const std::filesystem::path& path, StateDict& dest,
                     const LoadOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  if (format::is_s3(path)) {
    const auto [root, name] = format::StorageRoot::of_snapshot(path);
    const Manifest m = root->read_manifest(name);
    restore::StoredSnapshot stored(*root, name, m);
    return load_into_from(store_source(stored, path), dest, options, t0);
  }
  return restore::read_snapshot(path, [&](const format::SnapshotDir& dir) {
    const Manifest m = format::read_manifest_in(dir);
    restore::OpenedShards opened;
    return load_into_from(disk_source(dir, m, opened), dest, options, t0);
  });
}

LoadReport load_into(const HotSnapshot& snapshot, StateDict& dest, const LoadOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::shared_ptr<stage::HotImage> image = detail::HotAccess::pin(snapshot);
  return load_into_from(hot_source(*image), dest, options, t0);
}

}  // namespace tsnap
