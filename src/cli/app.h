#pragma once
// What the two programs of the tool share: `tsnap` (the read-only commands, without LibTorch)
// and `tsnap-torch` (the commands that make tensors, which `tsnap` runs for them). Each builds
// its CLI11 app from the subcommands it holds and runs the one the command line names.

#include <vector>

#include "cli/commands.h"

namespace CLI {
class App;
}

namespace tsnap::cli {

/// The commands that `tsnap` hands to `tsnap-torch`, and what `tsnap --help` says of them.
struct TorchCommand {
  const char* name;
  const char* summary;
};
inline constexpr TorchCommand kTorchCommands[] = {
    {"bench", "Benchmark checkpoint throughput (like fio for snapshots)"},
    {"consolidate", "Merge a distributed snapshot's pieces into a single-process snapshot"},
    {"agent", "Run a snapshot agent: saves handed to it outlive their trainer"},
};

/// "tsnap 0.1.0 (snapshot format v2, LibTorch 2.x)".
const char* version_text();
/// A new app named "tsnap" with the tool's description, --version, usage errors and footer.
void configure(CLI::App& app);
/// Parses `argv` with `app`, whose subcommands are `commands`, and runs the one chosen; every
/// failure becomes a one-line message on stderr. Returns the exit status.
int parse_and_run(CLI::App& app, const std::vector<Command>& commands, int argc, char** argv);

}  // namespace tsnap::cli
