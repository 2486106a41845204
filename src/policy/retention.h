#pragma once
/// \file
/// The crash-safe retention sequence of periodic snapshots (named by `format::step_name`).
///
/// Retention runs only after a new snapshot has committed (its rename and the root's fsync are
/// done), and deletes each expired snapshot in two steps:
///   1. rename `<root>/step-N` to a temporary name `<root>/.step-N.tmp-<id>`: one atomic
///      step after which the directory is no longer a snapshot;
///   2. remove the temporary directory and its files.
/// A crash before 1 leaves the snapshot complete; a crash after 1 leaves a temporary directory,
/// never read as a snapshot and removed by the next writer on the root (pipeline/root_lock.h). The
/// snapshot just committed is never expired, so every moment has at least one complete snapshot.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tsnap/schedule.h"

namespace tsnap::policy {

/// The points of the retention sequence of one expired snapshot, for fault-injection tests.
enum class RetentionPoint {
  kBeforeRename,  ///< Nothing done yet to this snapshot.
  kRenamed,       ///< Renamed to its temporary name; its files are all still there.
  kRemoved,       ///< Its temporary directory is gone.
};
/// Called at each point with the path the snapshot has at that moment; a test throws from it to
/// stop the sequence there, leaving the disk as a crash at that moment would.
using RetentionProbe = std::function<void(RetentionPoint, const std::filesystem::path&)>;

/// Deletes the periodic snapshots (named by `format::step_name`) under `root` that `schedule`
/// expires, considering the committed ones up to `newest_step`, the step of the snapshot just
/// committed (later ones, left by an abandoned run, are left for the saves that will overwrite
/// them). Returns the names deleted, oldest first. Errors: IoError naming the directory and errno
/// when a rename fails (earlier deletions stand); a failed removal of a renamed directory is not an
/// error (it is a temporary now, removed by a later writer). Not thread-safe for one root.
/// `may_delete` (when set) is asked about each expired snapshot by name; one it refuses stays
/// (the local tier of a two-tier Snapshotter keeps the snapshots not drained yet).
std::vector<std::string> apply_retention(
    const std::filesystem::path& root, const Schedule& schedule, int64_t newest_step,
    const RetentionProbe& probe = {},
    const std::function<bool(const std::string&)>& may_delete = {});

}  // namespace tsnap::policy
