#pragma once
/// \file
/// Where snapshots live: one interface over the kinds of root, so that what reads, lists and
/// removes snapshots does not branch on where they are. Two implementations:
///   - DirRoot (format/dir_root.h): a directory; snapshot `name` is `<root>/<name>/`, committed
///     once its MANIFEST.json is there (the commit protocol renames a complete directory in);
///   - S3Root (format/s3_root.h): "s3://bucket/prefix"; snapshot `name` is the objects
///     `<prefix>/<name>/<file>`, committed once `<prefix>/<name>/MANIFEST.json` exists (writers
///     put it last and delete it first).
/// Both give the same answers for the same snapshots (tests/support/storage_root_suite.h runs one
/// conformance suite against each): the same listing (names, committed or not, oldest first),
/// the manifest's exact bytes, the files and their sizes, byte ranges, and a removal that stops
/// listing the snapshot as committed before any of its files goes.
/// Thread-safety: every method may be called from any thread. Ownership: a root owns nothing
/// but its location (and a shared S3 client).

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tsnap/catalog.h"
#include "tsnap/manifest.h"

namespace tsnap::format {

class StorageRoot {
 public:
  virtual ~StorageRoot() = default;

  /// The root at `location`: "s3://bucket/prefix", or a directory (which need not exist: it
  /// then lists nothing). Errors: InvalidArgument for a malformed URL.
  static std::unique_ptr<StorageRoot> open(const std::filesystem::path& location);
  /// The root that holds snapshot `snapshot` (a directory path or a URL), and the snapshot's
  /// name. Errors: InvalidArgument when `snapshot` names no snapshot (a bucket, an empty name).
  static std::pair<std::unique_ptr<StorageRoot>, std::string> of_snapshot(
      const std::filesystem::path& snapshot);

  /// Where snapshot `name` is: `<root>/<name>` or "s3://bucket/prefix/<name>".
  virtual std::filesystem::path locate(const std::string& name) const = 0;
  /// Every snapshot under the root, committed or not, oldest first (tsnap::list). Errors:
  /// IoError when the root cannot be listed.
  virtual std::vector<Listed> list() const = 0;
  /// The exact bytes of `name`'s MANIFEST.json, or nullopt when it has none (not committed,
  /// or no such snapshot). Errors: IoError when it cannot be read; kBadManifest beyond the cap.
  virtual std::optional<std::string> manifest_text(const std::string& name) const = 0;
  /// `name`'s manifest, parsed and checked. Errors: IoError(kNotFound) when it has none;
  /// FormatError as tsnap::read_manifest.
  virtual Manifest read_manifest(const std::string& name) const;
  /// The files of snapshot `name` (MANIFEST.json included) and their sizes in bytes; empty when
  /// there is no such snapshot. Errors: IoError.
  virtual std::map<std::string, uint64_t> file_sizes(const std::string& name) const = 0;
  /// Reads bytes [offset, offset + n) of file `file` of snapshot `name` into `out`. Errors:
  /// IoError(kNotFound) when the file does not exist; kTruncated when it ends before
  /// offset + n; IoError for the rest.
  virtual void read(const std::string& name, const std::string& file, uint64_t offset, void* out,
                    size_t n) const = 0;
  /// Removes snapshot `name`: first it stops being listed as committed (a directory is renamed
  /// to a temporary name; an object store's manifest is deleted), and `unlisted` (when set) is
  /// called with where it then is; then everything else of it goes. Returns that place.
  /// Errors: IoError(kNotFound) when there is no such snapshot; IoError when the first step
  /// fails (nothing is removed then). After it: a directory's failures are not reported (the
  /// temporary is a later writer's to remove); a store's are (IoError: the objects stay, listed
  /// as a temporary, until the name is removed or written again).
  virtual std::filesystem::path remove(
      const std::string& name,
      const std::function<void(const std::filesystem::path&)>& unlisted = nullptr) const = 0;
};

}  // namespace tsnap::format
