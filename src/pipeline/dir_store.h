#pragma once
/// \file
/// A directory as a durable root's write side (pipeline/durable_store.h). A save alone is
/// written into `<root>/.<name>.tmp-<fresh id>` and committed by commit_directory (commit.h):
/// the manifest last, fsyncs, one atomic exchange with an older save of the name. A shared save
/// (node-local roots) is written into `<root>/.<name>.tmp-<save id>.share`, which the ranks
/// share and a writer starting alone does not remove as stale (its files may be those of ranks
/// that are gone): each file arrives as a part file of the rank that copies it and is renamed
/// into place; whoever finds every file in place commits, under that directory's flock.

#include <memory>

#include "pipeline/durable_store.h"

namespace tsnap::pipeline {

/// Node-local roots on a directory: the ranks' shared temporary directory of a save is
/// `<durable>/.<name>.tmp-<id>.share`.
inline constexpr const char* kShareSuffix = ".share";

/// The store of directory `config.root` (created, and locked: RootLock). Errors: IoError when
/// it cannot be created or opened.
std::unique_ptr<DurableStore> make_dir_store(DurableConfig config);

}  // namespace tsnap::pipeline
