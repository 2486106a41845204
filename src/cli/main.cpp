// `tsnap`: the command-line tool. Parses the command line with CLI11 and runs one subcommand.
//
// Exit status: 0 success; 1 an operation failed (I/O or format error, verification failed);
// 2 the command line could not be parsed.

#include <c10/util/Exception.h>
#include <torch/version.h>

#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/output.h"
#include "tsnap/error.h"
#include "tsnap/manifest.h"

// The tsnap version comes from the build (CMake's project version).
#ifndef TSNAP_VERSION_STRING
#define TSNAP_VERSION_STRING "unknown"
#endif

namespace tsnap::cli {
namespace {

std::string version_text() {
  return std::string("tsnap ") + TSNAP_VERSION_STRING + " (snapshot format v" +
         std::to_string(kFormatVersion) + ", LibTorch " + TORCH_VERSION + ")";
}

std::string usage_error(const CLI::App* app, const CLI::Error& e) {
  return std::string("tsnap: error: ") + e.what() + "\nRun 'tsnap --help' for usage.\n";
}

int report(const char* message) {
  std::cerr << "tsnap: error: " << plain_message(message) << '\n';
  return kExitFailed;
}

// Runs a parsed subcommand; every failure becomes a one-line message and exit status 1.
int run_guarded(const Command& command) {
  try {
    return command.run();
  } catch (const Error& e) {
    return report(e.what());
  } catch (const c10::Error& e) {
    return report(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return report(e.what());
  }
}

int main_impl(int argc, char** argv) {
  CLI::App app("Inspect and verify tsnap snapshots.", "tsnap");
  app.failure_message(usage_error);
  app.set_version_flag("--version", version_text(), "Print the version and exit");
  app.require_subcommand(1);
  const std::vector<Command> commands = {
      add_ls(app),   add_inspect(app), add_verify(app),      add_cat(app),
      add_diff(app), add_bench(app),   add_consolidate(app), add_export(app),
  };
  app.footer(
      "Run 'tsnap SUBCOMMAND --help' for a subcommand's options.\n"
      "Exit status: 0 ok, 1 failed (error or verification failure), 2 usage error.");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version arrive here too, with exit code 0.
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  }
  for (const Command& command : commands) {
    if (command.app->parsed()) return run_guarded(command);
  }
  return kExitUsage;  // unreachable: require_subcommand(1)
}

}  // namespace
}  // namespace tsnap::cli

int main(int argc, char** argv) { return tsnap::cli::main_impl(argc, argv); }
