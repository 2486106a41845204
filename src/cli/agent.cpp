// `tsnap agent`: runs a snapshot agent (tsnap/agent.h) until SIGTERM or SIGINT.

#include "tsnap/agent.h"

#include <signal.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <string>

#include "cli/commands.h"

namespace tsnap::cli {
namespace {

int run_agent(const std::string& socket) {
  // Blocked before the agent's threads start, so that only sigwait takes them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  AgentOptions options;
  options.socket = socket;
  Agent agent(options);
  std::cerr << "tsnap agent: listening at " << socket << std::endl;
  int sig = 0;
  sigwait(&set, &sig);
  std::cerr << "tsnap agent: stopping (" << (sig == SIGTERM ? "SIGTERM" : "SIGINT") << "), "
            << agent.commits() << " save(s) committed for trainers that exited" << std::endl;
  return kExitOk;
}

}  // namespace

Command add_agent(CLI::App& app) {
  auto socket = std::make_shared<std::string>();
  CLI::App* sub =
      app.add_subcommand("agent", "Run a snapshot agent: saves handed to it outlive their trainer");
  sub->footer(
      "Listen at SOCKET for trainers whose Snapshotter names it (SnapshotterOptions::agent, "
      "Python agent=...). Each save such a trainer makes is handed to the agent once staged; if "
      "the trainer dies before committing it, the agent commits it from the trainer's staging "
      "memory, and a trainer restarted on the same root resumes from that memory. One agent per "
      "node serves any number of trainers on distinct roots. Runs until SIGTERM or SIGINT.");
  sub->add_option("--socket", *socket, "Unix socket path to listen at")
      ->required()
      ->type_name("PATH");
  return {sub, [socket] { return run_agent(*socket); }};
}

}  // namespace tsnap::cli
