#pragma once
/// \file
/// A directory as a snapshot root (format/storage_root.h): snapshot `name` is `<root>/<name>/`,
/// committed once its MANIFEST.json is there; `.<name>.tmp-<id>` directories are temporaries of
/// unfinished saves (and of removals in progress).

#include <filesystem>
#include <string>

#include "format/storage_root.h"

namespace tsnap::format {

class DirRoot final : public StorageRoot {
 public:
  explicit DirRoot(std::filesystem::path root) : root_(std::move(root)) {}

  std::filesystem::path locate(const std::string& name) const override { return root_ / name; }
  std::vector<Listed> list() const override;
  std::optional<std::string> manifest_text(const std::string& name) const override;
  /// Errors name what is missing: the directory, or its MANIFEST.json.
  Manifest read_manifest(const std::string& name) const override;
  std::map<std::string, uint64_t> file_sizes(const std::string& name) const override;
  void read(const std::string& name, const std::string& file, uint64_t offset, void* out,
            size_t n) const override;
  /// Renames `<root>/<name>` to a fresh temporary name, then removes that tree.
  std::filesystem::path remove(
      const std::string& name,
      const std::function<void(const std::filesystem::path&)>& unlisted = nullptr) const override;

 private:
  std::filesystem::path root_;
};

/// Whether the snapshot directory `snapshot` holds every file of `m` at its size: a node's copy
/// of a snapshot on node-local roots (TierOptions::node_local) holds only its ranks' files.
bool holds_every_file(const std::filesystem::path& snapshot, const Manifest& m);

}  // namespace tsnap::format
