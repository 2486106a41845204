// `tsnap-torch`: the subcommands of the tool that make tensors (cli/app.h, kTorchCommands),
// linked with LibTorch. `tsnap` runs it for them with the same command line, so its messages
// and help speak as `tsnap`.

#include <c10/util/Exception.h>

#include <CLI/CLI.hpp>
#include <stdexcept>
#include <vector>

#include "cli/app.h"
#include "cli/commands.h"

namespace tsnap::cli {
namespace {

int main_impl(int argc, char** argv) {
  CLI::App app;
  configure(app);
  std::vector<Command> commands = {add_bench(app), add_consolidate(app), add_agent(app)};
  for (Command& c : commands) {
    // LibTorch's errors carry a C++ backtrace: the tool shows their message only.
    c.run = [run = c.run] {
      try {
        return run();
      } catch (const c10::Error& e) {
        throw std::runtime_error(e.what_without_backtrace());
      }
    };
  }
  return parse_and_run(app, commands, argc, argv);
}

}  // namespace
}  // namespace tsnap::cli

int main(int argc, char** argv) { return tsnap::cli::main_impl(argc, argv); }
