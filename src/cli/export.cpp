// `tsnap export --hf OUT SNAPSHOT`: a snapshot as a Hugging Face model directory
// (model.safetensors, or model-0000i-of-0000N.safetensors + model.safetensors.index.json),
// written by tsnap::export_hf (include/tsnap/hf_export.h).

#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/output.h"
#include "tsnap/hf_export.h"

namespace tsnap::cli {
namespace {

namespace fs = std::filesystem;

struct ExportOptions {
  fs::path hf;
  fs::path snapshot;
  std::string object;
  std::string dtype;
  uint64_t max_shard_size = HfExportOptions{}.max_shard_size;
  bool overwrite = false;
  bool copy = false;
};

int run_export(const ExportOptions& o) {
  HfExportOptions options;
  options.object = o.object;
  options.max_shard_size = o.max_shard_size;
  options.overwrite = o.overwrite;
  options.link = !o.copy;
  if (!o.dtype.empty()) {
    static const std::map<std::string, at::ScalarType> kDtypes = {
        {"bf16", at::kBFloat16}, {"f16", at::kHalf}, {"f32", at::kFloat}};
    options.dtype = kDtypes.at(o.dtype);  // CLI11 checked the choice
  }
  const HfExportResult r = export_hf(o.snapshot, o.hf, options);
  std::cout << "exported " << o.snapshot.string()
            << (o.object.empty() ? "" : " (object '" + o.object + "')") << " to " << o.hf.string()
            << ": " << count_of(r.tensors, "tensor", "tensors") << ", " << human_bytes(r.total_size)
            << " in " << count_of(r.files.size(), "file", "files")
            << (r.linked ? " (hard links to the snapshot's verified shards)" : "") << '\n';
  for (const std::string& f : r.files) std::cout << "  " << f << '\n';
  return kExitOk;
}

}  // namespace

Command add_export(CLI::App& app) {
  auto options = std::make_shared<ExportOptions>();
  CLI::App* sub = app.add_subcommand("export", "Export a snapshot for other tools (Hugging Face)");
  sub->footer(
      "--hf OUT writes a new directory OUT that safetensors and transformers' from_pretrained "
      "read without tsnap: model.safetensors, or model-0000i-of-0000N.safetensors files plus "
      "model.safetensors.index.json when the data exceeds --max-shard-size. --object NAME "
      "exports only the keys of checkpoint object NAME ('NAME/fc1.weight' is written as "
      "'fc1.weight'); --dtype converts floating tensors (integer and bool ones are kept). Every "
      "chunk read is verified; the state is held in memory once; OUT is written under a "
      "temporary name and renamed when complete. Refuses an existing OUT unless --overwrite. "
      "Without --object or a dtype change, a single-process snapshot's shard files (each a "
      "standard safetensors file) are verified and hard-linked into OUT, taking no space, "
      "unless --copy or another filesystem asks for copies.");
  sub->add_option("--hf", options->hf, "Output directory (Hugging Face layout)")
      ->required()
      ->type_name("OUT");
  sub->add_option("SNAPSHOT", options->snapshot, "Snapshot directory (holds MANIFEST.json)")
      ->required()
      ->type_name("DIR");
  sub->add_option("--object", options->object, "Export only this checkpoint object's keys")
      ->type_name("NAME");
  sub->add_option("--dtype", options->dtype, "Convert floating tensors to this dtype")
      ->check(CLI::IsMember({"bf16", "f16", "f32"}));
  sub->add_option("--max-shard-size", options->max_shard_size,
                  "Largest data bytes per file before splitting (default 5000000000)")
      ->type_name("BYTES")
      ->check(CLI::PositiveNumber);
  sub->add_flag("--overwrite", options->overwrite, "Replace OUT if it exists");
  sub->add_flag("--copy", options->copy, "Write new files even where hard links would do");
  return {sub, [options] { return run_export(*options); }};
}

}  // namespace tsnap::cli
