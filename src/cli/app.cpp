#include "cli/app.h"

#include <torch/version.h>

#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>
#include <string>

#include "cli/output.h"
#include "tsnap/error.h"
#include "tsnap/manifest.h"

// The tsnap version comes from the build (CMake's project version).
#ifndef TSNAP_VERSION_STRING
#define TSNAP_VERSION_STRING "unknown"
#endif

namespace tsnap::cli {
namespace {

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
  } catch (const std::exception& e) {
    return report(e.what());
  }
}

}  // namespace

const char* version_text() {
  static const std::string text = std::string("tsnap ") + TSNAP_VERSION_STRING +
                                  " (snapshot format v" + std::to_string(kFormatVersion) +
                                  ", LibTorch " + TORCH_VERSION + ")";
  return text.c_str();
}

void configure(CLI::App& app) {
  app.name("tsnap");
  app.description("Inspect and verify tsnap snapshots.");
  app.failure_message(usage_error);
  app.set_version_flag("--version", version_text(), "Print the version and exit");
  app.require_subcommand(1);
  app.footer(
      "Run 'tsnap SUBCOMMAND --help' for a subcommand's options.\n"
      "Exit status: 0 ok, 1 failed (error or verification failure), 2 usage error.");
}

int parse_and_run(CLI::App& app, const std::vector<Command>& commands, int argc, char** argv) {
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

}  // namespace tsnap::cli
