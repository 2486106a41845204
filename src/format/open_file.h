#pragma once
// Opening a snapshot and its files for reading, with the checks every reader needs, in one
// place. The directory is opened once (SnapshotDir) and its files relative to it, so a reader
// keeps reading the tree it started with while a writer overwrites the name (the old tree is
// renamed away, then removed: a reader that finds a file gone asks replaced() and starts over
// on the new tree). A missing file is IoError(kNotFound); a symbolic link (never written by
// tsnap; following it would let a snapshot make a reader open any file) and anything but a
// regular file (a FIFO would block open() forever) are FormatError(kUnsafePath); other failures
// IoError naming the call and errno.

#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "io/fd.h"

namespace tsnap::format {

/// An open snapshot file and its fstat.
struct OpenedFile {
  io::UniqueFd fd;
  struct stat st {};
  uint64_t size() const { return static_cast<uint64_t>(st.st_size); }
};

/// A snapshot directory, opened once. Move-only.
struct SnapshotDir {
  io::UniqueFd fd;
  std::filesystem::path path;  ///< As given: names files in messages.

  /// Opens `path` (following a link to it, as any path the caller gives). Errors:
  /// IoError(kNotFound) when it does not exist or is not a directory, IoError otherwise.
  static SnapshotDir open(const std::filesystem::path& path);
  /// True when `path` names another directory now than the one opened (overwritten since).
  bool replaced() const;
  /// Another descriptor of the same directory (for a reader that outlives the caller's).
  SnapshotDir duplicate() const;
  /// `path / name` as a string, for messages.
  std::string label(const std::string& name) const { return (path / name).string(); }
};

/// Opens `name` relative to `dirfd` (io::kAtCwd: the working directory) read-only, with
/// `extra_flags` (e.g. O_DIRECT); `label` names it in errors after `what` ("manifest",
/// "shard"). Errors as in the file comment.
OpenedFile open_snapshot_file(int dirfd, const std::string& name, const std::string& label,
                              const std::string& what, int extra_flags = 0);

/// The file `name` of `dir`.
inline OpenedFile open_snapshot_file(const SnapshotDir& dir, const std::string& name,
                                     const std::string& what, int extra_flags = 0) {
  return open_snapshot_file(dir.fd.get(), name, dir.label(name), what, extra_flags);
}

}  // namespace tsnap::format
