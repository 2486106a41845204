#include "format/storage_root.h"

#include "format/dir_root.h"
#include "format/layout.h"
#include "format/manifest_io.h"
#include "format/s3_root.h"
#include "tsnap/error.h"

namespace tsnap::format {

std::unique_ptr<StorageRoot> StorageRoot::open(const std::filesystem::path& location) {
  if (is_s3(location)) return std::make_unique<S3Root>(location.native());
  return std::make_unique<DirRoot>(location);
}

std::pair<std::unique_ptr<StorageRoot>, std::string> StorageRoot::of_snapshot(
    const std::filesystem::path& snapshot) {
  if (is_s3(snapshot)) {
    auto [root, name] = S3Root::of_snapshot(snapshot.native());
    return {std::make_unique<S3Root>(std::move(root)), name};
  }
  // A trailing separator ("ckpt/step-1/") names the same directory.
  const std::filesystem::path path = snapshot.has_filename() ? snapshot : snapshot.parent_path();
  return {std::make_unique<DirRoot>(path.parent_path()), path.filename().string()};
}

Manifest StorageRoot::read_manifest(const std::string& name) const {
  const std::string label = (locate(name) / kManifestName).string();
  const std::optional<std::string> text = manifest_text(name);
  if (!text) throw_error(ErrorCode::kNotFound, label + " does not exist");
  return parse_manifest(*text, label);
}

}  // namespace tsnap::format
