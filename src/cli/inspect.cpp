// `tsnap inspect SNAPSHOT`: what a snapshot holds, from its manifest (no shard data is read).

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/output.h"
#include "format/manifest_io.h"
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
                        {"end", t.end}};
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
                     {"chunks", f.chunk_hashes.size()}});
  }
  nlohmann::json out = format::manifest_header_json(m);
  out["path"] = path.string();
  out["tensor_bytes"] = tensor_bytes(m);
  out["total_bytes"] = m.total_bytes();
  out["tensors"] = std::move(tensors);
  out["files"] = std::move(files);
  return out;
}

void print_text(const fs::path& path, const Manifest& m) {
  std::cout << "snapshot:    " << path.string() << '\n'
            << "id:          " << m.id << '\n'
            << "created:     " << m.created << '\n'
            << "format:      " << kFormatName << " v" << m.format_version << '\n'
            << "written by:  tsnap " << m.tsnap_version << ", LibTorch " << m.torch_version << '\n'
            << "world size:  " << m.world_size << '\n'
            << "tensors:     " << m.tensors.size() << " (" << human_bytes(tensor_bytes(m)) << ")\n"
            << "files:       " << m.files.size() << " (" << human_bytes(m.total_bytes()) << ")\n"
            << "metadata:    " << m.metadata.dump(2) << "\n\n";

  const bool sharded = std::any_of(m.tensors.begin(), m.tensors.end(),
                                   [](const TensorRecord& t) { return t.shard.has_value(); });
  std::vector<std::string> headers = {"TENSOR", "DTYPE", "SOURCE", "SHAPE", "BYTES", "FILE"};
  if (sharded) headers.push_back("SHARD");
  Table tensors(std::move(headers));
  tensors.set_numeric(4);
  for (const TensorRecord& t : m.tensors) {
    std::vector<std::string> row = {t.name,
                                    dtype_string(t.dtype),
                                    dtype_string(t.source_dtype),
                                    shape_string(t.shape),
                                    human_bytes(t.nbytes()),
                                    t.file};
    if (sharded) {
      row.push_back(t.shard ? shape_string(t.shard->offsets) + " of " +
                                  shape_string(t.shard->global_shape)
                            : "-");
    }
    tensors.add_row(std::move(row));
  }
  tensors.print(std::cout);
  std::cout << '\n';

  Table files({"FILE", "SIZE", "CHUNKS", "CHUNK SIZE"});
  for (size_t c = 1; c < 4; ++c) files.set_numeric(c);
  for (const FileRecord& f : m.files) {
    files.add_row({f.name, human_bytes(f.size), std::to_string(f.chunk_hashes.size()),
                   human_bytes(f.chunk_bytes)});
  }
  files.print(std::cout);
}

int run_inspect(const InspectOptions& options) {
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
      "(size, chunk count). Reads MANIFEST.json only; use `tsnap verify` to check the data.");
  sub->add_option("SNAPSHOT", options->snapshot, "Snapshot directory (holds MANIFEST.json)")
      ->required()
      ->type_name("DIR");
  sub->add_flag("--json", options->json, "Print JSON instead of text");
  return {sub, [options] { return run_inspect(*options); }};
}

}  // namespace tsnap::cli
