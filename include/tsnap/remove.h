#pragma once
/// \file
/// Removing snapshots and directory trees: `tsnap::remove_snapshot` (never leaves a snapshot
/// that looks committed but is half gone) and `tsnap::remove_tree`.

#include <filesystem>

#include "tsnap/export.h"

namespace tsnap {

/// Removes the committed snapshot directory `snapshot` (`<root>/<name>`) so that no reader ever
/// sees it half removed: it is first renamed to a temporary name under its root (which every
/// reader skips and the next writer on that root cleans up), then its tree is removed.
/// This is what retention does. Errors: IoError(kNotFound) when `snapshot` does not exist,
/// IoError naming both paths when the rename fails. A failure while removing the renamed tree
/// is not an error: the leftover temporary goes with the next writer's cleanup.
/// Thread-safety: do not remove a snapshot that a Snapshotter is replacing (overwrite) at once.
TSNAP_API void remove_snapshot(const std::filesystem::path& snapshot);

/// Removes `path` and everything below it without following symbolic links; a missing `path`
/// is success. Use it instead of std::filesystem::remove_all in programs that link LibTorch:
/// the torch wheels export their own std::filesystem symbols from libtorch.so, and a process
/// can bind remove_all to a copy that crashes (seen with torch 2.11). Errors: IoError naming
/// the path and errno of the first entry that could not be removed (the rest is still removed).
TSNAP_API void remove_tree(const std::filesystem::path& path);

}  // namespace tsnap
