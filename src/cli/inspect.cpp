// `tsnap inspect SNAPSHOT`: what a snapshot holds, from its manifest (no shard data is read).
// A distributed save's snapshot also shows its ranks (files and bytes each wrote) and, for each
// key, whether it is replicated (stored whole, by one rank) or sharded (stored as pieces of a
// global tensor, listed piece by piece after the keys).

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/keys.h"
#include "cli/output.h"
#include "format/manifest_io.h"
#include "tsnap/error.h"
#include "tsnap/manifest.h"

namespace tsnap::cli {
namespace {

namespace fs = std::filesystem;

struct InspectOptions {
  fs::path snapshot;
  bool json = false;
};

uint64_t tensor_bytes(const Manifest& m) {
  uint64_t total = 0;
  for (const TensorRecord& t : m.tensors) total += t.nbytes();
  return total;
}

int rank_of(const Manifest& m, const TensorRecord& t) {
  const FileRecord* f = m.find_file(t.file);
  return f ? f->rank : 0;
}

// What each rank wrote.
struct RankFigures {
  uint64_t files = 0, bytes = 0, tensors = 0, tensor_bytes = 0;
};

std::vector<RankFigures> rank_figures(const Manifest& m) {
  int ranks = m.world_size;
  for (const FileRecord& f : m.files) ranks = std::max(ranks, f.rank + 1);
  std::vector<RankFigures> out(static_cast<size_t>(std::max(ranks, 1)));
  for (const FileRecord& f : m.files) {
    ++out[static_cast<size_t>(f.rank)].files;
    out[static_cast<size_t>(f.rank)].bytes += f.size;
  }
  for (const TensorRecord& t : m.tensors) {
    RankFigures& r = out[static_cast<size_t>(rank_of(m, t))];
    ++r.tensors;
    r.tensor_bytes += t.nbytes();
  }
  return out;
}

// Whether to show ranks and how each key is stored: a distributed save, or sharded state.
bool distributed(const Manifest& m) {
  return m.world_size > 1 || std::any_of(m.tensors.begin(), m.tensors.end(),
                                         [](const TensorRecord& t) { return t.shard.has_value(); });
}

nlohmann::json to_json(const fs::path& path, const Manifest& m) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const TensorRecord& t : m.tensors) {
    nlohmann::json j = {{"name", t.name},
                        {"dtype", dtype_string(t.dtype)},
                        {"source_dtype", dtype_string(t.source_dtype)},
                        {"shape", t.shape},
                        {"bytes", t.nbytes()},
                        {"file", t.file},
                        {"begin", t.begin},
                        {"end", t.end},
                        {"rank", rank_of(m, t)}};
    if (t.shard) {
      j["shard"] = {{"global_shape", t.shard->global_shape}, {"offsets", t.shard->offsets}};
    }
    tensors.push_back(std::move(j));
  }
  nlohmann::json files = nlohmann::json::array();
  for (const FileRecord& f : m.files) {
    files.push_back({{"name", f.name},
                     {"size", f.size},
                     {"data_offset", f.data_offset},
                     {"chunk_bytes", f.chunk_bytes},
                     {"chunks", f.chunk_hashes.size()},
                     {"rank", f.rank},
                     {"reused_from", f.reused_from}});
  }
  nlohmann::json keys = nlohmann::json::array();
  for (const KeyView& k : key_views(m)) {
    keys.push_back({{"name", k.name},
                    {"kind", k.kind(m)},
                    {"pieces", k.pieces.size()},
                    {"shape", k.shape()},
                    {"bytes", k.bytes()},
                    {"ranks", k.ranks(m)}});
  }
  nlohmann::json ranks = nlohmann::json::array();
  const std::vector<RankFigures> figures = rank_figures(m);
  for (size_t r = 0; r < figures.size(); ++r) {
    ranks.push_back({{"rank", r},
                     {"files", figures[r].files},
                     {"bytes", figures[r].bytes},
                     {"tensors", figures[r].tensors},
                     {"tensor_bytes", figures[r].tensor_bytes}});
  }
  nlohmann::json out = format::manifest_header_json(m);
  out["format_version"] = m.format_version;  // as the file says, like the text output
  out["path"] = path.string();
  out["tensor_bytes"] = tensor_bytes(m);
  out["total_bytes"] = m.total_bytes();
  out["manifest_bytes"] = manifest_bytes(path);
  out["keys"] = std::move(keys);
  out["tensors"] = std::move(tensors);
  out["files"] = std::move(files);
  out["ranks"] = std::move(ranks);
  return out;
}

void print_text(const fs::path& path, const Manifest& m) {
  const std::vector<KeyView> keys = key_views(m);
  const bool dist = distributed(m);
  size_t sharded = 0;
  for (const KeyView& k : keys) sharded += k.sharded() ? 1 : 0;
  std::cout << "snapshot:    " << path.string() << '\n'
            << "id:          " << m.id << '\n'
            << "created:     " << m.created << '\n'
            << "format:      " << kFormatName << " v" << m.format_version << '\n'
            << "written by:  tsnap " << m.tsnap_version << ", LibTorch " << m.torch_version << '\n'
            << "world size:  " << m.world_size << '\n';
  if (m.step) std::cout << "step:        " << *m.step << '\n';
  if (!m.unchanged_since.empty()) {
    std::cout << "unchanged:   " << m.unchanged.size() << " tensors identical to "
              << m.unchanged_since << '\n';
  }
  std::cout << "tensors:     " << m.tensors.size() << " (" << human_bytes(tensor_bytes(m)) << ")\n";
  if (dist) {
    std::cout << "keys:        " << keys.size() << " (" << keys.size() - sharded << " "
              << (m.world_size > 1 ? "replicated" : "whole") << ", " << sharded << " sharded)\n";
  }
  std::cout << "files:       " << m.files.size() << " shards (" << human_bytes(m.total_bytes())
            << ") + " << kManifestName << " (" << human_bytes(manifest_bytes(path)) << ")\n"
            << "metadata:    " << m.metadata.dump(2) << "\n\n";

  if (m.world_size > 1) {
    Table ranks({"RANK", "FILES", "BYTES", "TENSORS", "TENSOR BYTES"});
    for (size_t c = 0; c < 5; ++c) ranks.set_numeric(c);
    const std::vector<RankFigures> figures = rank_figures(m);
    for (size_t r = 0; r < figures.size(); ++r) {
      ranks.add_row({std::to_string(r), std::to_string(figures[r].files),
                     human_bytes(figures[r].bytes), std::to_string(figures[r].tensors),
                     human_bytes(figures[r].tensor_bytes)});
    }
    ranks.print(std::cout);
    std::cout << '\n';
  }

  // One row per key: a sharded key's global shape and the pieces' total bytes.
  std::vector<std::string> headers = {"TENSOR", "DTYPE", "SOURCE", "SHAPE", "BYTES", "FILE"};
  if (dist) headers.insert(headers.end(), {"RANK", "STORED"});
  Table tensors(std::move(headers));
  tensors.set_numeric(4);
  for (const KeyView& k : keys) {
    const TensorRecord& t = *k.pieces.front();
    std::vector<std::string> row = {
        k.name,
        dtype_string(t.dtype),
        dtype_string(t.source_dtype),
        shape_string(k.shape()),
        human_bytes(k.bytes()),
        k.pieces.size() == 1 ? t.file : count_of(k.pieces.size(), "file", "files")};
    if (dist) {
      row.push_back(ranks_string(k.ranks(m)));
      row.push_back(k.sharded() ? "sharded, " + count_of(k.pieces.size(), "piece", "pieces")
                                : k.kind(m));
    }
    tensors.add_row(std::move(row));
  }
  tensors.print(std::cout);
  std::cout << '\n';

  if (sharded > 0) {
    Table pieces({"PIECE OF", "OFFSETS", "SHAPE", "BYTES", "FILE", "RANK"});
    pieces.set_numeric(3);
    pieces.set_numeric(5);
    for (const KeyView& k : keys) {
      if (!k.sharded()) continue;
      for (const TensorRecord* t : k.pieces) {
        pieces.add_row({k.name, shape_string(t->shard->offsets), shape_string(t->shape),
                        human_bytes(t->nbytes()), t->file, std::to_string(rank_of(m, *t))});
      }
    }
    pieces.print(std::cout);
    std::cout << '\n';
  }

  std::vector<std::string> file_headers = {"FILE", "SIZE", "CHUNKS", "CHUNK SIZE"};
  if (dist) file_headers.push_back("RANK");
  Table files(std::move(file_headers));
  for (size_t c = 1; c < (dist ? 5 : 4); ++c) files.set_numeric(c);
  for (const FileRecord& f : m.files) {
    std::vector<std::string> row = {f.name, human_bytes(f.size),
                                    std::to_string(f.chunk_hashes.size()),
                                    human_bytes(f.chunk_bytes)};
    if (dist) row.push_back(std::to_string(f.rank));
    files.add_row(std::move(row));
  }
  files.print(std::cout);
}

int run_inspect(const InspectOptions& options) {
  std::error_code ec;
  if (fs::is_directory(options.snapshot, ec) &&
      !fs::exists(fs::symlink_status(options.snapshot / "MANIFEST.json", ec))) {
    throw_error(ErrorCode::kNotFound,
                options.snapshot.string() +
                    " is not a snapshot (it has no MANIFEST.json); if it holds snapshots, list "
                    "them with: tsnap ls " +
                    options.snapshot.string());
  }
  const Manifest m = read_manifest(options.snapshot);
  if (options.json) {
    std::cout << to_json(options.snapshot, m).dump(2) << '\n';
  } else {
    print_text(options.snapshot, m);
  }
  return kExitOk;
}

}  // namespace

Command add_inspect(CLI::App& app) {
  auto options = std::make_shared<InspectOptions>();
  CLI::App* sub = app.add_subcommand("inspect", "Show the contents of a snapshot");
  sub->footer(
      "Show a snapshot's versions, id, creation time, world size and user metadata, every "
      "tensor (name, stored and source dtype, shape, bytes, shard file) and every shard file "
      "(size, chunk count). For a distributed save, also the files and bytes each rank wrote, "
      "and for each key whether it is replicated (stored whole, by one rank) or sharded "
      "(stored as pieces: its global shape, then each piece's offsets, file and rank). Reads "
      "MANIFEST.json only; use `tsnap verify` to check the data.");
  sub->add_option("SNAPSHOT", options->snapshot, "Snapshot directory (holds MANIFEST.json)")
      ->required()
      ->type_name("DIR");
  sub->add_flag("--json", options->json, "Print JSON instead of text");
  return {sub, [options] { return run_inspect(*options); }};
}

}  // namespace tsnap::cli
