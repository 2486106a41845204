/// \file
/// The durable commit protocol of a snapshot. A directory is a snapshot only if it holds a valid
/// MANIFEST.json, and only a renamed, fully synced directory ever has one at its final name.
///
///   1. The shard files are written into `<root>/.<name>.tmp-<id>/` (never the final path).
///   2. Each shard file is truncated to its exact size (O_DIRECT pads the tail) and fsynced.
///   3. MANIFEST.json is written last into the temporary directory, then fsynced.
///   4. The temporary directory is fsynced (its entries are durable).
///   5. The temporary directory is renamed to `<root>/<name>`:
///        - new name: renameat2(RENAME_NOREPLACE), so a concurrent writer cannot be overwritten;
///        - overwrite: renameat2(RENAME_EXCHANGE) swaps old and new in one atomic step, so at
///          every instant exactly one of them is committed at `<root>/<name>`.
///   6. The root directory is fsynced (the rename is durable).
///   7. After an exchange, the old snapshot (now at the temporary path) is removed.
/// A crash before step 5 leaves only a temporary directory (never read as a snapshot, removed
/// by a later writer); a crash after it leaves the new snapshot committed.

#include "pipeline/commit.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <system_error>

#include "common/remove_tree.h"
#include "common/sys_error.h"
#include "io/fd.h"
#include "tsnap/error.h"
#include "tsnap/manifest.h"

namespace tsnap::pipeline {
namespace {

void check(int rc, const std::string& what) {
  if (rc < 0) detail::throw_sys_error(rc, what);
}

// Writes `text` into a new file and fsyncs it, through the engine (so faults can be injected).
void write_file_durably(io::Engine& engine, const std::string& path, const std::string& text) {
  const int fd = engine.open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
  check(fd, "create " + path);
  int rc = io::write_and_wait(engine, fd, text.data(), text.size(), 0);
  if (rc == 0) rc = engine.fsync(fd);
  const int close_rc = engine.close(fd);
  check(rc, "write " + path);
  check(close_rc, "close " + path);
}

}  // namespace

void check_replaceable(const std::string& final_path, Replaceable check) {
  std::error_code ec;
  const auto st = std::filesystem::symlink_status(final_path + "/" + kManifestName, ec);
  const bool empty_dir =
      std::filesystem::is_directory(std::filesystem::symlink_status(final_path, ec)) &&
      std::filesystem::is_empty(final_path, ec) && !ec;
  if (empty_dir) return;
  const std::string refusal = "overwrite replaces snapshots only; remove it or choose another name";
  if (!std::filesystem::is_regular_file(st)) {
    throw_error(ErrorCode::kAlreadyExists, final_path +
                                               " exists and is not a tsnap snapshot (it has no " +
                                               kManifestName + "): " + refusal);
  }
  if (check == Replaceable::kManifestFile) return;
  try {
    (void)read_manifest(final_path);  // parses, and its checksum holds
  } catch (const Error& e) {
    throw_error(ErrorCode::kAlreadyExists,
                final_path + " exists and is not a tsnap snapshot: " + e.what() + "; " + refusal);
  }
}

uint64_t commit_directory(io::Engine& engine, const CommitPaths& paths,
                          const std::string& manifest_text, bool overwrite, std::string* leftover) {
  const std::string manifest = paths.temporary + "/" + kManifestName;
  write_file_durably(engine, manifest, manifest_text);
  check(engine.fsync_dir(paths.temporary), "fsync directory " + paths.temporary);

  std::error_code ec;
  const bool replace = overwrite && std::filesystem::exists(paths.final, ec);
  if (replace) check_replaceable(paths.final, Replaceable::kValidManifest);
  const int rc = engine.rename(paths.temporary, paths.final,
                               replace ? io::RenameMode::kExchange : io::RenameMode::kNoReplace);
  if (rc == -EEXIST || rc == -ENOTEMPTY) {
    throw_error(ErrorCode::kAlreadyExists,
                "snapshot " + paths.final + " already exists (pass overwrite to replace it)");
  }
  check(rc, "rename " + paths.temporary + " to " + paths.final);
  // From here on the snapshot is committed; a failing root fsync is still reported, since the
  // rename may not survive a power loss.
  const int sync_rc = engine.fsync_dir(paths.root);
  // The old snapshot now lives under the temporary name; if it cannot be removed (permissions),
  // the save still succeeded, and the next writer alone on the root tries again.
  if (replace && detail::remove_tree(paths.temporary) != 0 && leftover) {
    *leftover = paths.temporary;
  }
  check(sync_rc, "fsync directory " + paths.root);
  return manifest_text.size();
}

namespace {

// Whether `final_path` holds a committed snapshot of save `id`.
bool committed_as(const std::string& final_path, const std::string& id) {
  try {
    return read_manifest(final_path).id == id;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace

uint64_t commit_node_copy(io::Engine& engine, const CommitPaths& paths,
                          const std::string& manifest_text, const std::string& id, bool overwrite,
                          std::string* leftover) {
  // The descriptor follows the directory through the rename: a rank that waited for the lock
  // while another committed holds the committed directory, and finds `id` at the final path.
  const io::UniqueFd dir(::open(paths.temporary.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) {
    const int err = errno;
    if (committed_as(paths.final, id)) return 0;  // committed by another rank of this node
    detail::throw_sys_error(-err, "open temporary directory " + paths.temporary);
  }
  const io::FileLock lock(dir.get(), /*try_only=*/false);
  if (!lock.locked()) {
    detail::throw_sys_error(-lock.error(), "lock temporary directory " + paths.temporary);
  }
  if (committed_as(paths.final, id)) return 0;
  // A rank of this node killed between writing the manifest and the rename left it.
  (void)::unlinkat(dir.get(), kManifestName, 0);
  return commit_directory(engine, paths, manifest_text, overwrite, leftover);
}

void remove_temporary(const std::string& path) noexcept { (void)detail::remove_tree(path); }

}  // namespace tsnap::pipeline
