// `tsnap consolidate SNAPSHOT OUT`: a single-process copy of a snapshot (world size 1, every
// key whole): a distributed save's pieces are assembled into their global tensors, and each
// tensor keeps its stored dtype (bf16 stays bf16) and its source dtype. The user metadata is
// copied. The copy is
// written with tsnap::save, so it is committed atomically; the whole state is held in memory
// once.

#include <ATen/ATen.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/output.h"
#include "tsnap/error.h"
#include "tsnap/load.h"
#include "tsnap/manifest.h"
#include "tsnap/save.h"

namespace tsnap::cli {
namespace {

namespace fs = std::filesystem;

struct ConsolidateOptions {
  fs::path snapshot;
  fs::path out;
  bool overwrite = false;
};

// A bare name goes next to the snapshot (under the same root); anything else is a path.
fs::path target_of(const ConsolidateOptions& o) {
  if (o.out.has_parent_path() || o.out.is_absolute()) return o.out;
  const fs::path snapshot = o.snapshot.has_filename() ? o.snapshot : o.snapshot.parent_path();
  return snapshot.parent_path() / o.out;
}

int run_consolidate(const ConsolidateOptions& options) {
  const Manifest m = read_manifest(options.snapshot);  // a missing manifest fails first
  const fs::path target = target_of(options);
  std::error_code ec;
  if (!options.overwrite && fs::exists(fs::symlink_status(target, ec))) {
    throw_error(ErrorCode::kAlreadyExists,
                target.string() + " already exists; pass --overwrite to replace it");
  }
  StateDict state = load(options.snapshot);
  for (auto& [key, entry] : state) {
    if (entry.shard && entry.shard->global_shape != entry.tensor.sizes().vec()) {
      throw_error(ErrorCode::kUnsupported,
                  "tensor '" + key + "' of " + options.snapshot.string() +
                      " holds only a piece of its global tensor (a rank's part without its "
                      "peers'): it cannot be consolidated");
    }
    entry.shard.reset();  // a piece that covers the whole tensor is the tensor
    // Saved from another dtype (fp32 stored as bf16): hand over the source dtype's values,
    // which the save converts back to the same stored bytes, so both dtypes are recorded.
    const TensorRecord& r = *m.find(key);
    if (r.source_dtype != r.dtype) {
      entry.tensor = entry.tensor.to(r.source_dtype);
      entry.dtype = r.dtype;
    }
  }
  SaveOptions save;
  save.overwrite = options.overwrite;
  const SaveStats stats = tsnap::save(target, state, m.metadata, save);
  std::cout << "consolidated " << options.snapshot.string() << " (world size " << m.world_size
            << ", " << count_of(m.tensors.size(), "record", "records") << ") into "
            << target.string() << ": " << count_of(state.size(), "tensor", "tensors") << ", "
            << count_of(stats.files, "file", "files") << ", " << human_bytes(stats.bytes) << '\n';
  return kExitOk;
}

}  // namespace

Command add_consolidate(CLI::App& app) {
  auto options = std::make_shared<ConsolidateOptions>();
  CLI::App* sub =
      app.add_subcommand("consolidate", "Write a single-process copy of a (distributed) snapshot");
  sub->footer(
      "Load SNAPSHOT, assembling every key stored as pieces (a distributed save of sharded "
      "state) into its global tensor, and save it as a new snapshot of world size 1 in which "
      "every key is whole: OUT, a path, or a bare name for a snapshot next to SNAPSHOT. Stored "
      "and source dtypes and the user metadata are kept. Every "
      "chunk read is verified; the state is held in memory once. Refuses an existing OUT "
      "unless --overwrite (which replaces a snapshot atomically).");
  sub->add_option("SNAPSHOT", options->snapshot, "Snapshot directory (holds MANIFEST.json)")
      ->required()
      ->type_name("DIR");
  sub->add_option("OUT", options->out, "New snapshot: a path, or a name next to SNAPSHOT")
      ->required()
      ->type_name("DIR|NAME");
  sub->add_flag("--overwrite", options->overwrite, "Replace OUT if it exists");
  return {sub, [options] { return run_consolidate(*options); }};
}

}  // namespace tsnap::cli
