#pragma once
// The child processes of the crash tests: this same test program, started again by exec (so that
// no thread state is inherited through fork) and narrowed by a gtest filter to a test that runs
// only as a child (it skips unless its environment variable is set).

#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

extern char** environ;

namespace tsnap::crash_test {

/// Starts `/proc/self/exe --gtest_filter=<test>` with `env` added to the environment; returns
/// its pid (or -1 when fork failed). File descriptors without FD_CLOEXEC are inherited. Between
/// fork and exec the child only calls execve (the parent may have threads).
inline pid_t spawn_self(const std::string& test,
                        const std::vector<std::pair<std::string, std::string>>& env) {
  std::vector<std::string> strings;
  for (const auto& [name, value] : env) strings.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (std::string& s : strings) envp.push_back(s.data());
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);  // first definition wins
  envp.push_back(nullptr);
  std::string program = "tsnap_crash_tests", filter = "--gtest_filter=" + test;
  std::string brief = "--gtest_brief=1";
  char* const argv[] = {program.data(), filter.data(), brief.data(), nullptr};
  const pid_t pid = fork();
  if (pid == 0) {
    ::execve("/proc/self/exe", argv, envp.data());
    _exit(127);
  }
  return pid;
}

}  // namespace tsnap::crash_test
