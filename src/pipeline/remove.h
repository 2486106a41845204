#pragma once
// Removing a committed snapshot without ever leaving it half removed under its name: rename to
// a temporary name first (readers skip temporaries), then remove the tree. Shared by the public
// tsnap::remove_snapshot and retention.

#include <filesystem>
#include <functional>

namespace tsnap::pipeline {

/// Renames `snapshot` to a fresh temporary name under its parent, calls `renamed(temporary)`
/// when set, removes the temporary tree (failures ignored: the next writer cleans it up) and
/// returns the temporary path. Throws IoError naming both paths when the rename fails.
std::filesystem::path remove_snapshot(
    const std::filesystem::path& snapshot,
    const std::function<void(const std::filesystem::path&)>& renamed = nullptr);

}  // namespace tsnap::pipeline
