#pragma once
/// \file
/// A snapshot root in object storage, "s3://bucket/prefix": the same layout as a directory
/// root, one object per file. Snapshot `name` is the objects `<prefix>/<name>/<file>`, and it
/// exists (is committed) once `<prefix>/<name>/MANIFEST.json` does: writers upload the shards
/// first and the manifest last, and delete the manifest first, so that a reader never sees a
/// partial snapshot. A name whose objects have no manifest (an upload in progress, or one a
/// kill interrupted) lists as temporary. The public calls that take a path (list, latest,
/// read_manifest, remove_snapshot, load, load_into, verify) accept such URLs through this.
///
/// Credentials and endpoint come from the environment (io::S3Config::from_environment); a
/// client per distinct configuration is kept for the process, so calls reuse connections.
/// Thread-safety: every function may be called from any thread.

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "format/storage_root.h"
#include "io/s3_client.h"
#include "tsnap/catalog.h"
#include "tsnap/manifest.h"

namespace tsnap::format {

/// True when `path` names object storage ("s3://...").
bool is_s3(const std::filesystem::path& path);

/// The S3 client for the current environment's configuration (shared, made once per distinct
/// configuration). Errors: InvalidArgument for a bad endpoint.
std::shared_ptr<io::S3Client> s3_client();

/// One root "s3://bucket/prefix" (prefix may be empty).
class S3Root final : public StorageRoot {
 public:
  /// Errors: InvalidArgument for a URL io::S3Url::parse rejects.
  explicit S3Root(const std::string& url);

  /// A snapshot URL "s3://bucket/prefix/name" split into its root and name.
  /// Errors: InvalidArgument when there is no name, or it is not a valid snapshot name.
  static std::pair<S3Root, std::string> of_snapshot(const std::string& url);

  const io::S3Url& location() const { return url_; }
  io::S3Client& client() const { return *client_; }
  /// "s3://bucket/prefix/<name>".
  std::string url(const std::string& name) const;
  /// The key of `file` of snapshot `name`.
  std::string key(const std::string& name, const std::string& file) const;

  /// "s3://bucket/prefix/<name>".
  std::filesystem::path locate(const std::string& name) const override { return url(name); }
  /// Every snapshot name under the root (committed, or objects without a manifest: temporary),
  /// oldest first, as tsnap::list describes. Errors: IoError when the store cannot be listed.
  std::vector<Listed> list() const override;
  /// The exact bytes of `name`'s manifest, or nullopt when it has none.
  std::optional<std::string> manifest_text(const std::string& name) const override;
  /// The objects of `name`'s files (file name -> bytes), from one listing; objects below them
  /// (the marks of a node-local drain) are not files. Errors: IoError.
  std::map<std::string, uint64_t> file_sizes(const std::string& name) const override;
  /// A ranged GET (io::S3Client::get_range).
  void read(const std::string& name, const std::string& file, uint64_t offset, void* out,
            size_t n) const override;
  /// Removes snapshot `name`: its manifest first (it is no longer listed as committed), then
  /// every other object under it. Errors: IoError(kNotFound) when it has no object at all.
  std::filesystem::path remove(
      const std::string& name,
      const std::function<void(const std::filesystem::path&)>& unlisted = nullptr) const override;
  /// Deletes the objects under `name` that `keep` (file names) does not hold; the manifest is
  /// kept when committed. For the leftovers of an earlier save of the same name.
  void remove_other_objects(const std::string& name, const std::vector<std::string>& keep) const;

 private:
  io::S3Url url_;
  std::shared_ptr<io::S3Client> client_;
};

}  // namespace tsnap::format
