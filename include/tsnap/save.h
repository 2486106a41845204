#pragma once
/// \file
/// `tsnap::save`: a synchronous save, `Snapshotter::save_async(...).wait()` on a pipeline sized
/// for one snapshot.

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tsnap/export.h"
#include "tsnap/save_handle.h"
#include "tsnap/save_options.h"
#include "tsnap/state_dict.h"

namespace tsnap {

/// Saves `state` with user `metadata` (a JSON object) to the snapshot directory `path` and
/// returns once it is committed. Errors: as Snapshotter::save_async, plus the save's own.
/// `metadata` null means none.
TSNAP_API SaveStats save(const std::filesystem::path& path, const StateDict& state,
                         const nlohmann::json& metadata = nlohmann::json::object(),
                         const SaveOptions& options = {});

}  // namespace tsnap
