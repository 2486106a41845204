// `tsnap`: the command-line tool. Parses the command line with CLI11 and runs one subcommand.
// It links tsnap's torch-free core only, so that its read-only commands start at once; the
// commands that make tensors (cli/app.h, kTorchCommands) run in `tsnap-torch`, found next to
// this program, which gets the same command line.
//
// Exit status: 0 success; 1 an operation failed (I/O or format error, verification failed);
// 2 the command line could not be parsed.

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "cli/app.h"
#include "cli/commands.h"

namespace tsnap::cli {
namespace {

// Replaces this process with `tsnap-torch` from this program's directory, same arguments.
int run_torch_tool(char** argv) {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::filesystem::path tool =
      (ec ? std::filesystem::path(argv[0]) : self).parent_path() / "tsnap-torch";
  if (tool.has_parent_path()) {
    ::execv(tool.c_str(), argv);
  } else {
    ::execvp("tsnap-torch", argv);  // started through PATH, and /proc is not mounted
  }
  std::cerr << "tsnap: error: '" << argv[1] << "' runs " << tool.string() << ", which "
            << (errno == ENOENT ? "is not there (install tsnap's tools together)"
                                : std::string("cannot run: ") + std::strerror(errno))
            << '\n';
  return kExitFailed;
}

int main_impl(int argc, char** argv) {
  if (argc > 1) {
    for (const TorchCommand& c : kTorchCommands) {
      if (std::strcmp(argv[1], c.name) == 0) return run_torch_tool(argv);
    }
  }
  CLI::App app;
  configure(app);
  const std::vector<Command> commands = {
      add_ls(app), add_inspect(app), add_verify(app), add_cat(app), add_diff(app), add_export(app),
  };
  for (const TorchCommand& c : kTorchCommands) app.add_subcommand(c.name, c.summary);
  return parse_and_run(app, commands, argc, argv);
}

}  // namespace
}  // namespace tsnap::cli

int main(int argc, char** argv) { return tsnap::cli::main_impl(argc, argv); }
