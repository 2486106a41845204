// `tsnap verify SNAPSHOT`: re-hash every chunk of every shard against the manifest.

#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/output.h"
#include "tsnap/load.h"
#include "tsnap/manifest.h"

namespace tsnap::cli {
namespace {

namespace fs = std::filesystem;

struct VerifyOptions {
  fs::path snapshot;
};

int run_verify(const VerifyOptions& options) {
  // The manifest is read first so that a missing or corrupt one fails as an error (exit 1),
  // and to count what was checked.
  const Manifest m = read_manifest(options.snapshot);
  uint64_t chunks = 0;
  for (const FileRecord& f : m.files) chunks += f.chunk_hashes.size();

  const std::vector<BadChunk> bad = verify(options.snapshot);
  if (bad.empty()) {
    std::cout << "OK: " << count_of(m.files.size(), "file", "files") << ", "
              << count_of(chunks, "chunk", "chunks") << " verified\n";
    return kExitOk;
  }
  Table table({"FILE", "CHUNK", "OFFSET", "PROBLEM"});
  table.set_numeric(1);
  table.set_numeric(2);
  for (const BadChunk& b : bad) {
    table.add_row({b.file, std::to_string(b.chunk), std::to_string(b.offset), b.problem});
  }
  table.print(std::cout);
  std::cout << "FAILED: " << bad.size() << " of " << count_of(chunks, "chunk", "chunks")
            << " bad\n";
  return kExitFailed;
}

}  // namespace

Command add_verify(CLI::App& app) {
  auto options = std::make_shared<VerifyOptions>();
  CLI::App* sub = app.add_subcommand("verify", "Check every chunk of a snapshot against its hash");
  sub->footer(
      "Read every shard file of SNAPSHOT and compare each chunk's XXH3-64 with MANIFEST.json. "
      "Prints \"OK: ...\" and exits 0 when all match; otherwise lists each bad chunk (file, "
      "chunk index, byte offset, problem) and exits 1.");
  sub->add_option("SNAPSHOT", options->snapshot, "Snapshot directory (holds MANIFEST.json)")
      ->required()
      ->type_name("DIR");
  return {sub, [options] { return run_verify(*options); }};
}

}  // namespace tsnap::cli
