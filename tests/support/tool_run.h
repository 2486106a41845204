#pragma once
// Runs the `tsnap` tool from a test (the programs that test it get TSNAP_CLI_PATH from CMake).

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace tsnap::test_support {

struct ToolRun {
  int status = -1;     // exit status
  std::string output;  // stdout and stderr
};

/// Runs the tool with `args` (shell words); status -1 when it could not run.
inline ToolRun tsnap_cli(const std::string& args) {
  ToolRun run;
#ifdef TSNAP_CLI_PATH
  FILE* p = ::popen((std::string(TSNAP_CLI_PATH) + " " + args + " 2>&1").c_str(), "r");
  if (p == nullptr) return run;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) run.output.append(buf, n);
  const int status = ::pclose(p);
  run.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
#endif
  return run;
}

}  // namespace tsnap::test_support
