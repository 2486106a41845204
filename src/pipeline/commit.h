#pragma once
// The durable commit of a snapshot directory (protocol in commit.cpp).

#include <string>

#include "io/engine.h"

namespace tsnap::pipeline {

/// Paths of one save: `<root>/.<name>.tmp-<id>` becomes `<root>/<name>`.
struct CommitPaths {
  std::string root;
  std::string temporary;
  std::string final;
};

/// How closely check_replaceable looks at a snapshot's manifest.
enum class Replaceable {
  kManifestFile,   ///< a regular MANIFEST.json (cheap: the check a save makes at its call)
  kValidManifest,  ///< a MANIFEST.json that parses and whose checksum holds (at the commit)
};

/// Throws Error(kAlreadyExists) unless `final_path` (which exists) is a snapshot that an
/// overwrite may replace: a directory holding a tsnap manifest (as `check` says), or an empty
/// directory. A save never replaces a directory that holds what tsnap did not write (another
/// tool's checkpoint, a user's files, a file that is only named MANIFEST.json).
void check_replaceable(const std::string& final_path, Replaceable check);

/// Steps 3-7 of the protocol: writes `manifest_text` as MANIFEST.json into the temporary
/// directory (shard files are already fsynced and closed), fsyncs it and the directory, moves
/// the directory to its final name (atomically swapping with an existing snapshot when
/// `overwrite`), fsyncs the root, and removes the replaced snapshot. Returns the manifest's size.
/// Throws IoError naming the step and path, or Error(kAlreadyExists). A throw before the rename
/// leaves no committed directory created or changed; only the root fsync comes after it, and a
/// failure there is still reported (the snapshot is in place but its rename may not survive a
/// power loss).
/// `*leftover` (when given) is set to the temporary path of a replaced snapshot that could not
/// be removed.
uint64_t commit_directory(io::Engine& engine, const CommitPaths& paths,
                          const std::string& manifest_text, bool overwrite,
                          std::string* leftover = nullptr);

/// Node-local roots (TierOptions::node_local): commits this node's copy of save `id`, whose
/// temporary directory the node's ranks share, with the manifest rank 0 merged. The first of
/// them to take the directory's lock (flock) runs commit_directory; the others find `id`
/// committed at the final path and return 0. Same errors as commit_directory, and Error
/// (kNotFound) when neither the temporary directory nor the committed copy is there.
uint64_t commit_node_copy(io::Engine& engine, const CommitPaths& paths,
                          const std::string& manifest_text, const std::string& id, bool overwrite,
                          std::string* leftover = nullptr);

/// Removes a temporary directory and everything in it; never throws.
void remove_temporary(const std::string& path) noexcept;

}  // namespace tsnap::pipeline
