#pragma once
// What a benchmark run holds while it runs: a fresh working directory inside the target
// directory, removed on every way out, and a progress line on stderr.

#include <cstdint>
#include <filesystem>
#include <string>

namespace tsnap::bench {

/// A fresh directory `<target>/tsnap-bench-<pid>` for everything a run writes.
/// Thread-safety: none. Ownership: removes the directory and its contents on destruction
/// (also when an exception unwinds), unless keep() was called; not on a signal.
class WorkDir {
 public:
  /// Creates `target` if needed, then the working directory inside it.
  /// Errors: std::runtime_error "cannot use target directory ..." / "cannot write to target
  /// directory ..." with the reason.
  explicit WorkDir(const std::filesystem::path& target);
  ~WorkDir();
  WorkDir(const WorkDir&) = delete;
  WorkDir& operator=(const WorkDir&) = delete;

  /// The working directory.
  const std::filesystem::path& path() const { return path_; }
  /// Throws std::runtime_error "not enough free space in TARGET: ..." when its filesystem has
  /// fewer than `bytes` available (does nothing where statvfs fails).
  void require_free(uint64_t bytes) const;
  /// Leaves the directory in place on destruction.
  void keep() { keep_ = true; }

 private:
  std::filesystem::path target_;
  std::filesystem::path path_;
  bool keep_ = false;
};

/// The progress line on stderr: rewritten in place on a terminal, one line each otherwise.
/// Thread-safety: none. The destructor clears the line (also when an exception unwinds).
class Progress {
 public:
  Progress();
  ~Progress() { done(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  /// Shows `text` as the current step.
  void show(const std::string& text);
  /// Clears the line (on a terminal); call before printing results.
  void done();

 private:
  bool tty_;
  bool shown_ = false;
};

}  // namespace tsnap::bench
