#pragma once
// The subcommands of the `tsnap` tool. Each one lives in its own .cpp: `add_<name>` adds it to
// the CLI11 app, binds its options, and returns a Command whose `run` does the work. A new
// subcommand is one more file and one more line in main.cpp, or, when it makes tensors, in
// torch_main.cpp and cli/app.h's kTorchCommands (`tsnap-torch` runs it; `tsnap` stays
// torch-free).

#include <functional>

namespace CLI {
class App;
}

namespace tsnap::cli {

/// Exit codes, as users of git and fio expect.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;  ///< Verification failed, or an operation failed.
inline constexpr int kExitUsage = 2;   ///< The command line could not be parsed.

/// A registered subcommand.
struct Command {
  CLI::App* app = nullptr;   ///< Its CLI11 node (owned by the parent app); parsed() once chosen.
  std::function<int()> run;  ///< Returns the exit code; throws tsnap::Error on failure.
};

Command add_ls(CLI::App& app);
Command add_inspect(CLI::App& app);
Command add_verify(CLI::App& app);
Command add_cat(CLI::App& app);
Command add_diff(CLI::App& app);
Command add_export(CLI::App& app);
// In tsnap-torch:
Command add_consolidate(CLI::App& app);
Command add_bench(CLI::App& app);
Command add_agent(CLI::App& app);

}  // namespace tsnap::cli
