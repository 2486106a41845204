// Manifest -> JSON and text (manifest_to_json, manifest_to_text), and the checks a save runs
// so that it never writes what the reader refuses.

#include <algorithm>
#include <vector>

#include "common/hex.h"
#include "common/shape.h"
#include "format/dtype.h"
#include "format/hash.h"
#include "format/json_bounds.h"
#include "format/json_writer.h"
#include "format/manifest_internal.h"
#include "format/manifest_io.h"
#include "tsnap/error.h"

namespace tsnap::format {
namespace {

using nlohmann::json;

/// The manifest's tensors grouped by key, keys in order, each key's pieces in offsets order.
/// A key may have several records only if every one is a piece (has a shard).
std::vector<std::vector<const TensorRecord*>> tensor_groups(const Manifest& m) {
  std::vector<const TensorRecord*> order;
  order.reserve(m.tensors.size());
  for (const auto& t : m.tensors) order.push_back(&t);
  if (!std::is_sorted(order.begin(), order.end(), shard_before)) {
    std::sort(order.begin(), order.end(), shard_before);
  }
  std::vector<std::vector<const TensorRecord*>> groups;
  for (const TensorRecord* t : order) {
    if (groups.empty() || groups.back().front()->name != t->name) {
      groups.push_back({t});
      continue;
    }
    if (!t->shard || !groups.back().front()->shard) {
      throw_error(ErrorCode::kInvalidArgument, "manifest lists tensor '" + t->name +
                                                   "' twice (only pieces with a shard may "
                                                   "share a key)");
    }
    if (groups.back().back()->shard->offsets == t->shard->offsets) {
      throw_error(ErrorCode::kInvalidArgument, "manifest lists two pieces of tensor '" + t->name +
                                                   "' at offsets " +
                                                   detail::shape_string(t->shard->offsets));
    }
    groups.back().push_back(t);
  }
  return groups;
}

}  // namespace

int written_version(const Manifest&) { return kFormatVersion; }

json manifest_to_json(const Manifest& m) {
  if (!m.metadata.is_object()) {
    throw_error(
        ErrorCode::kInvalidArgument,
        std::string("manifest metadata must be a JSON object, not ") + m.metadata.type_name());
  }
  json files = json::object();
  for (const auto& f : m.files) {
    json hashes = json::array();
    for (uint64_t h : f.chunk_hashes) hashes.push_back(hex16(h));
    json rec{{"size", f.size},
             {"data_offset", f.data_offset},
             {"chunk_bytes", f.chunk_bytes},
             {"chunk_hashes", std::move(hashes)}};
    if (m.world_size > 1) rec["rank"] = f.rank;
    if (!f.tsnap_id.empty()) rec["tsnap_id"] = f.tsnap_id;
    if (!f.reused_from.empty()) rec["reused_from"] = f.reused_from;
    auto [it, inserted] = files.emplace(f.name, std::move(rec));
    if (!inserted) {
      throw_error(ErrorCode::kInvalidArgument, "manifest lists file '" + f.name + "' twice");
    }
  }
  const auto record = [](const TensorRecord& t) {
    json rec = {{"file", t.file},
                {"dtype", std::string(dtype_name(t.dtype))},
                {"source_dtype", std::string(dtype_name(t.source_dtype))},
                {"shape", t.shape},
                {"offsets", {t.begin, t.end}}};
    if (t.shard) {
      rec["shard"] = {{"global_shape", t.shard->global_shape}, {"offsets", t.shard->offsets}};
    }
    return rec;
  };
  json tensors = json::object();
  json weight_map = json::object();
  for (const auto& group : tensor_groups(m)) {
    const TensorRecord& t = *group.front();
    if (group.size() == 1) {
      tensors[t.name] = record(t);
      weight_map[t.name] = t.file;
      continue;
    }
    json pieces = json::array();
    for (const TensorRecord* p : group) pieces.push_back(record(*p));
    tensors[t.name] = {{"pieces", std::move(pieces)}};
  }
  json out = manifest_header_json(m);
  out["files"] = std::move(files);
  out["tensors"] = std::move(tensors);
  out["weight_map"] = std::move(weight_map);
  return out;
}

json manifest_header_json(const Manifest& m) {
  json out = {{"format", kFormatName},
              {"format_version", written_version(m)},
              {"id", m.id},
              {"tsnap_version", m.tsnap_version},
              {"torch_version", m.torch_version},
              {"created", m.created},
              {"created_unix_ns", m.created_unix_ns},
              {"world_size", m.world_size},
              {"metadata", m.metadata}};
  if (m.step) out["step"] = *m.step;
  if (!m.unchanged_since.empty()) {
    out["unchanged"] = {{"since", m.unchanged_since}, {"keys", m.unchanged}};
  }
  return out;
}

ManifestTensorText manifest_tensor_text(const Manifest& m) {
  const std::vector<std::vector<const TensorRecord*>> groups = tensor_groups(m);
  ManifestTensorText text;
  text.tensors.reserve(256 * m.tensors.size());
  JsonWriter w(text.tensors);
  const auto dims = [&](const std::vector<int64_t>& v) {
    w.begin_array();
    for (int64_t d : v) w.number(d);
    w.end_array();
  };
  w.begin_object();
  const auto record = [&](const TensorRecord* t) {
    w.begin_object();
    w.key("file");
    w.string(t->file);
    w.key("dtype");
    w.string(dtype_name(t->dtype));
    w.key("source_dtype");
    w.string(dtype_name(t->source_dtype));
    w.key("shape");
    dims(t->shape);
    w.key("offsets");
    w.begin_array();
    w.number(t->begin);
    w.number(t->end);
    w.end_array();
    if (t->shard) {
      w.key("shard");
      w.begin_object();
      w.key("global_shape");
      dims(t->shard->global_shape);
      w.key("offsets");
      dims(t->shard->offsets);
      w.end_object();
    }
    w.end_object();
  };
  for (const auto& group : groups) {
    w.newline();
    w.key(group.front()->name);
    if (group.size() == 1) {
      record(group.front());
      continue;
    }
    w.begin_object();
    w.key("pieces");
    w.begin_array();
    for (const TensorRecord* p : group) record(p);
    w.end_array();
    w.end_object();
  }
  w.end_object();

  JsonWriter map(text.weight_map);
  map.begin_object();
  for (const auto& group : groups) {
    if (group.size() != 1) continue;  // a key stored as pieces has no one file
    map.newline();
    map.key(group.front()->name);
    map.string(group.front()->file);
  }
  map.end_object();
  return text;
}

void scan_bounds(ManifestTensorText& text) {
  text.tensors_bounds.emplace();
  text.tensors_bounds->scan(text.tensors);
  text.weight_map_bounds.emplace();
  text.weight_map_bounds->scan(text.weight_map);
}

namespace {

// manifest_to_text; with `bounds`, scans the text into it as it is written, adding the bounds
// of the parts of `tensor_text` that have them.
std::string render_manifest(const Manifest& m, const ManifestTensorText* tensor_text,
                            JsonBounds* bounds) {
  if (!m.metadata.is_object()) {
    throw_error(
        ErrorCode::kInvalidArgument,
        std::string("manifest metadata must be a JSON object, not ") + m.metadata.type_name());
  }
  // Files and tensors in name order, as manifest_to_json's std::map-backed objects have them.
  const auto by_name = [](const auto* a, const auto* b) { return a->name < b->name; };
  std::vector<const FileRecord*> files;
  files.reserve(m.files.size());
  for (const auto& f : m.files) files.push_back(&f);
  std::sort(files.begin(), files.end(), by_name);
  for (size_t i = 1; i < files.size(); ++i) {
    if (files[i]->name == files[i - 1]->name) {
      throw_error(ErrorCode::kInvalidArgument,
                  "manifest lists file '" + files[i]->name + "' twice");
    }
  }
  ManifestTensorText own;
  if (tensor_text == nullptr) {
    own = manifest_tensor_text(m);
    tensor_text = &own;
  }

  std::string out;
  out.reserve(1024 + 128 * m.files.size() + tensor_text->tensors.size() +
              tensor_text->weight_map.size());
  JsonWriter w(out);
  w.begin_object();
  w.key("format");
  w.string(kFormatName);
  w.key("format_version");
  w.number(int64_t{written_version(m)});
  w.key("id");
  w.string(m.id);
  w.key("tsnap_version");
  w.string(m.tsnap_version);
  w.key("torch_version");
  w.string(m.torch_version);
  w.key("created");
  w.string(m.created);
  w.key("created_unix_ns");
  w.number(int64_t{m.created_unix_ns});
  w.key("world_size");
  w.number(int64_t{m.world_size});
  w.key("metadata");
  w.raw(m.metadata.dump());
  if (m.step) {
    w.key("step");
    w.number(int64_t{*m.step});
  }
  if (!m.unchanged_since.empty()) {
    w.newline();
    w.key("unchanged");
    w.begin_object();
    w.key("since");
    w.string(m.unchanged_since);
    w.key("keys");
    w.begin_array();
    for (const std::string& k : m.unchanged) w.string(k);
    w.end_array();
    w.end_object();
  }

  w.key("files");
  w.begin_object();
  for (const FileRecord* f : files) {
    w.newline();
    w.key(f->name);
    w.begin_object();
    w.key("size");
    w.number(f->size);
    w.key("data_offset");
    w.number(f->data_offset);
    w.key("chunk_bytes");
    w.number(f->chunk_bytes);
    if (m.world_size > 1) {
      w.key("rank");
      w.number(int64_t{f->rank});
    }
    if (!f->tsnap_id.empty()) {
      w.key("tsnap_id");
      w.string(f->tsnap_id);
    }
    if (!f->reused_from.empty()) {
      w.key("reused_from");
      w.string(f->reused_from);
    }
    w.key("chunk_hashes");
    w.begin_array();
    for (uint64_t h : f->chunk_hashes) w.string(detail::hex64(h));
    w.end_array();
    w.end_object();
  }
  w.end_object();

  size_t scanned = 0;  // bytes of `out` in `bounds`
  const auto part = [&](const std::string& text, const std::optional<JsonBounds>& part_bounds) {
    w.raw(text);
    if (bounds != nullptr) {
      // Everything before the part (a separator the writer put before it included), then it.
      bounds->scan(std::string_view(out).substr(scanned, out.size() - text.size() - scanned));
      if (part_bounds) {
        bounds->add(*part_bounds);
      } else {
        bounds->scan(text);
      }
    }
    scanned = out.size();
  };
  w.newline();
  w.key("tensors");
  part(tensor_text->tensors, tensor_text->tensors_bounds);
  w.newline();
  w.key("weight_map");
  part(tensor_text->weight_map, tensor_text->weight_map_bounds);
  // The manifest's own checksum, its last member: XXH3-64 of every byte before it.
  const uint64_t checksum = hash64(out.data(), out.size());
  out += kChecksumMember;
  out += kChecksumPrefix;
  out += hex16(checksum);
  out += "\"}\n";
  if (bounds != nullptr) bounds->scan(std::string_view(out).substr(scanned));
  return out;
}

// Throws unless readers accept a manifest of `size` bytes whose bounds have `problem`.
void check_readable(size_t size, const std::string& problem) {
  if (size > kMaxManifestBytes) {
    throw_error(ErrorCode::kInvalidArgument,
                "the manifest would take " + std::to_string(size) +
                    " bytes, more than readers accept (" + std::to_string(kMaxManifestBytes) +
                    "): save fewer tensors or less metadata per snapshot");
  }
  if (!problem.empty()) {
    throw_error(ErrorCode::kInvalidArgument,
                "the manifest would be refused by readers: " + problem);
  }
}

}  // namespace

std::string manifest_to_text(const Manifest& m, const ManifestTensorText* tensor_text) {
  return render_manifest(m, tensor_text, nullptr);
}

std::string readable_manifest_text(const Manifest& m, const ManifestTensorText* tensor_text) {
  JsonBounds bounds;
  std::string text = render_manifest(m, tensor_text, &bounds);
  check_readable(text.size(), bounds.problem());
  return text;
}

void check_metadata_writable(const nlohmann::json& metadata) {
  // Under the manifest, metadata sits one level down (the manifest object itself).
  const size_t depth = json_depth(metadata);
  if (depth + 1 > kMaxJsonDepth) {
    throw_error(ErrorCode::kInvalidArgument, "metadata nests " + std::to_string(depth) +
                                                 " levels deep; snapshots allow " +
                                                 std::to_string(kMaxJsonDepth - 1));
  }
  std::string text;
  try {
    text = metadata.dump();
  } catch (const json::exception& e) {
    throw_error(ErrorCode::kInvalidArgument,
                "metadata cannot be written as JSON: " + printable(e.what(), 200));
  }
  if (text.size() > kMaxManifestBytes / 2) {
    throw_error(ErrorCode::kInvalidArgument, "metadata takes " + std::to_string(text.size()) +
                                                 " bytes as JSON; snapshots allow " +
                                                 std::to_string(kMaxManifestBytes / 2));
  }
  const std::string problem = json_bounds_problem(text, kMaxJsonDepth - 1);
  if (!problem.empty()) throw_error(ErrorCode::kInvalidArgument, "metadata refused: " + problem);
}

void check_manifest_readable(std::string_view text) {
  check_readable(text.size(), text.size() > kMaxManifestBytes ? "" : json_bounds_problem(text));
}

}  // namespace tsnap::format
