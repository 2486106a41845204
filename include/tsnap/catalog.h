#pragma once
/// \file
/// Finding snapshots under a root: `tsnap::list` and `tsnap::latest`.

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tsnap/export.h"
#include "tsnap/manifest.h"

namespace tsnap {

/// One directory under a root.
struct TSNAP_API Listed {
  std::filesystem::path path;
  std::string name;
  bool committed = false;            ///< Has a valid manifest.
  bool temporary = false;            ///< A `.<name>.tmp-<id>` directory of an unfinished save.
  std::optional<Manifest> manifest;  ///< Set when committed.
  std::string problem;               ///< Why it is not committed (missing or corrupt manifest).
};

/// Every snapshot directory under `root` (committed, temporary or corrupt), oldest first.
/// Errors: IoError if root cannot be read (a missing root lists nothing).
TSNAP_API std::vector<Listed> list(const std::filesystem::path& root);

/// The newest committed snapshot under `root`: highest integer `step` in its metadata, then
/// newest creation time; temporaries and corrupt snapshots are skipped.
TSNAP_API std::optional<std::filesystem::path> latest(const std::filesystem::path& root);

}  // namespace tsnap
