#include "tsnap/load.h"

#include <ATen/ATen.h>

#include <chrono>
#include <memory>
#include <optional>

#include "common/glob.h"
#include "format/dtype.h"
#include "format/manifest_io.h"
#include "restore/read_chunks.h"
#include "restore/read_plan.h"
#include "restore/read_snapshot.h"
#include "restore/shard_reader.h"
#include "tsnap/error.h"

namespace tsnap {
namespace {

std::vector<std::string> record_names(const Manifest& m) {
  std::vector<std::string> names;
  names.reserve(m.tensors.size());
  for (const TensorRecord& t : m.tensors) names.push_back(t.name);
  return names;
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

// A new tensor for `r`; an allocation failure becomes a tsnap error naming the tensor.
at::Tensor allocate(const TensorRecord& r) {
  try {
    return at::empty(r.shape, at::TensorOptions().dtype(r.dtype));
  } catch (const std::exception& e) {
    throw_error(ErrorCode::kUnsupported, "cannot allocate tensor '" + r.name + "' (" +
                                             std::to_string(r.end - r.begin) +
                                             " bytes): " + e.what());
  }
}

}  // namespace

StateDict load(const std::filesystem::path& path, const LoadOptions& options) {
  return restore::read_snapshot(path, [&](const format::SnapshotDir& dir) {
    const Manifest m = format::read_manifest_in(dir);
    const restore::RecordIndex index = restore::index_records(m);
    const std::vector<std::string> keys =
        detail::select_keys(record_names(m), options.include, options.exclude, /*strict=*/false);
    std::vector<at::Tensor> out;
    std::vector<restore::Target> targets;
    out.reserve(keys.size());
    // The manifest's sizes are believed only once the files are there with those sizes: a
    // manifest claiming a 1 TiB tensor over a small shard fails here, before any allocation.
    // The shards stay open for the reads.
    std::vector<const TensorRecord*> records;
    for (const std::string& k : keys) records.push_back(index.at(k));
    restore::OpenedShards opened = restore::open_shards(dir, m, records);
    for (const std::string& k : keys) {
      const TensorRecord* r = index.at(k);
      out.push_back(allocate(*r));
      targets.push_back({r, out.back().data_ptr(), r->dtype});
    }
    LoadOptions streaming = options;
    streaming.atomic = false;  // new tensors: a failed load returns nothing anyway
    restore::read_chunks(dir, m, targets, restore::plan_reads(m, targets, options.verify),
                         streaming, /*in_place=*/false, &opened);

    StateDict result;
    for (size_t i = 0; i < targets.size(); ++i) {
      StateEntry& e = result.insert(keys[i], std::move(out[i]));
      e.shard = targets[i].record->shard;
    }
    return result;
  });
}

namespace {

LoadReport load_into_dir(const format::SnapshotDir& dir, StateDict& dest,
                         const LoadOptions& options, std::chrono::steady_clock::time_point t0) {
  const std::filesystem::path& path = dir.path;
  const Manifest m = format::read_manifest_in(dir);
  const restore::RecordIndex index = restore::index_records(m);
  const std::vector<std::string> keys =
      detail::select_keys(dest.keys(), options.include, options.exclude, /*strict=*/false);

  // Every problem is found from the manifest before any destination byte changes.
  std::vector<std::string> missing, mismatched, unusable;
  std::vector<restore::Target> targets;
  for (const std::string& k : keys) {
    const auto it = index.find(k);
    if (it == index.end()) {
      missing.push_back(k);
      continue;
    }
    const at::Tensor& t = dest.at(k);
    if (!t.device().is_cpu() || t.layout() != at::kStrided || !t.is_contiguous()) {
      unusable.push_back(k);
    } else if (const auto why = mismatch(*it->second, t)) {
      mismatched.push_back(k + ": " + *why);
    } else {
      targets.push_back({it->second, t.data_ptr(), t.scalar_type()});
    }
  }
  const std::string where = " (snapshot " + path.string() + "); nothing was written";
  if (!missing.empty()) {
    throw_error(ErrorCode::kKeyNotFound,
                std::to_string(missing.size()) +
                    " destination keys are not in the snapshot: " + join(missing) + where);
  }
  if (!mismatched.empty()) {
    throw_error(ErrorCode::kShapeMismatch,
                std::to_string(mismatched.size()) +
                    " tensors do not fit their destination: " + join(mismatched) + where);
  }
  if (!unusable.empty()) {
    throw_error(ErrorCode::kInvalidArgument,
                "destinations must be contiguous CPU tensors: " + join(unusable) + where);
  }

  LoadReport report;
  for (const std::string& k :
       detail::select_keys(record_names(m), options.include, options.exclude, false)) {
    if (!dest.contains(k)) report.not_in_destination.push_back(k);
  }
  const restore::ReadStats stats = restore::read_chunks(
      dir, m, targets, restore::plan_reads(m, targets, options.verify), options, /*in_place=*/true);
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
  return restore::read_snapshot(
      path, [&](const format::SnapshotDir& dir) { return load_into_dir(dir, dest, options, t0); });
}

std::vector<BadChunk> verify(const std::filesystem::path& path) {
  return restore::read_snapshot(path, [](const format::SnapshotDir& dir) {
    const Manifest m = format::read_manifest_in(dir);
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
