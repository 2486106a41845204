#pragma once
// Every read of a snapshot (load, load_into, open, verify) opens its directory once and reads
// the manifest and shards relative to it (format::SnapshotDir). An overwrite of the name
// exchanges the directories and then removes the old tree, so a reader that started on the old
// one may find a file gone: when that happens and the name now holds another directory, the
// read starts over on the new one. A reader thus sees the old snapshot or the new one, never a
// mix, and never a misleading "corrupt" error.

#include <filesystem>
#include <utility>

#include "format/open_file.h"
#include "format/s3_root.h"
#include "restore/s3_fetch.h"
#include "tsnap/error.h"

namespace tsnap::restore {

/// How many times a read starts over on a name being overwritten before it reports the error.
inline constexpr int kMaxReadRestarts = 3;

/// True when `e`, thrown while reading `dir`, means the directory was replaced meanwhile.
inline bool lost_to_overwrite(const Error& e, const format::SnapshotDir& dir) {
  return e.code() == ErrorCode::kNotFound && dir.replaced();
}

/// Returns read(dir) for the snapshot at `path`, starting over (up to kMaxReadRestarts times)
/// when the name was overwritten while it read. Errors: those of `read` and SnapshotDir::open.
/// A snapshot in object storage ("s3://...") is read from a local copy (restore/s3_fetch.h).
template <typename Read>
auto read_snapshot(const std::filesystem::path& path, Read read)
    -> decltype(read(std::declval<const format::SnapshotDir&>())) {
  if (format::is_s3(path)) {
    const FetchedSnapshot local(path.native());
    return read(format::SnapshotDir::open(local.path()));
  }
  for (int attempt = 0;; ++attempt) {
    const format::SnapshotDir dir = format::SnapshotDir::open(path);
    try {
      return read(dir);
    } catch (const Error& e) {
      if (attempt >= kMaxReadRestarts || !lost_to_overwrite(e, dir)) throw;
    }
  }
}

}  // namespace tsnap::restore
