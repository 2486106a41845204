#include "tsnap/save.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "format/dtype.h"
#include "plan/plan.h"
#include "tsnap/error.h"
#include "tsnap/snapshotter.h"

namespace tsnap {
namespace {

constexpr uint64_t kMaxOneShotBudget = 256ull << 20;
constexpr uint64_t kMinChunk = 1ull << 20;

}  // namespace

SaveStats save(const std::filesystem::path& path, const StateDict& state,
               const nlohmann::json& metadata, const SaveOptions& options) {
  if (path.filename().empty()) {
    throw_error(ErrorCode::kInvalidArgument,
                "snapshot path '" + path.string() + "' has no final name");
  }
  // A pipeline sized for this snapshot: no bigger budget than the data needs.
  SnapshotterOptions so;
  so.root = path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();
  uint64_t bytes = 0;
  for (const auto& [key, entry] : state) {
    if (!entry.tensor.defined()) continue;  // the plan names it
    bytes += static_cast<uint64_t>(entry.tensor.numel()) *
             format::element_size(plan::stored_dtype(key, entry, options));
  }
  // Small states get small chunks (a few per snapshot, so they still write in parallel).
  so.chunk_bytes = options.chunk_bytes ? options.chunk_bytes
                                       : std::clamp<uint64_t>((bytes / 4 + 4095) / 4096 * 4096,
                                                              kMinChunk, so.chunk_bytes);
  const uint64_t chunks = bytes / so.chunk_bytes + 2;
  so.staging.budget_bytes = std::min(kMaxOneShotBudget, chunks * so.chunk_bytes);
  Snapshotter snap(std::move(so));
  SaveOptions eager = options;
  eager.staging = Staging::kEager;
  SaveHandle h = snap.save_async(path.filename().string(), state, metadata, eager);
  h.wait();
  return h.stats();
}

}  // namespace tsnap
