#pragma once
/// \file
/// Reading snapshots that live in object storage (format/s3_root.h): the chunks of each shard
/// come back as ranged GETs, several at once, and each is checked against the manifest's
/// XXH3-64 before it is used. open (the lazy reader) reads a local copy that fetch makes in a
/// temporary directory (removed afterwards); verify hashes the chunks as they arrive. load and
/// load_into read without a copy (restore/read_store_chunks.h).
///
/// Thread-safety: every function may be called from any thread. Each call runs its own
/// threads (kFetchThreads) and joins them before it returns.

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "format/s3_root.h"
#include "restore/read_store_chunks.h"
#include "tsnap/load.h"
#include "tsnap/manifest.h"

namespace tsnap::restore {

/// Copies snapshot `name` of `root` into the directory `dir` (created; must not exist): each
/// shard by ranged GETs of its chunks, each chunk checked before it is written (not fsynced:
/// the copies are temporary); the manifest (`text`, whose parse is `m`) last. Errors: FormatError
/// kHashMismatch or kTruncated naming the object, chunk and byte range; IoError from the store or
/// the local disk. On error `dir` may hold part of the copy (the caller removes it).
void fetch(const format::S3Root& root, const std::string& name, const Manifest& m,
           const std::string& text, const std::filesystem::path& dir);

/// A local copy of snapshot `url` ("s3://bucket/prefix/name") in a new temporary directory
/// (under TSNAP_FETCH_DIR, else the system's temporary directory), every file fetched at once,
/// removed by the destructor. For readers that need files (the lazy reader, exports); loads
/// read without a copy (restore/read_store_chunks.h).
/// Errors: those of fetch and S3Root::read_manifest. Ownership: owns the directory.
/// Thread-safety: one thread at a time.
class FetchedSnapshot {
 public:
  explicit FetchedSnapshot(const std::string& url);
  ~FetchedSnapshot();
  FetchedSnapshot(const FetchedSnapshot&) = delete;
  FetchedSnapshot& operator=(const FetchedSnapshot&) = delete;
  /// The local snapshot directory.
  const std::filesystem::path& path() const { return snapshot_; }
  /// Its manifest.
  const Manifest& manifest() const { return manifest_; }

 private:
  std::string name_;
  Manifest manifest_;
  std::filesystem::path top_;       // the temporary directory
  std::filesystem::path snapshot_;  // top_/<name>
};

/// verify() of snapshot `name` of a root read by ranges (object storage): every chunk of every
/// file fetched and hashed, kFetchThreads at once; the bad ones (hash mismatch, truncated or
/// missing file) are returned. A chunk past the end of its file is reported without a read.
/// Errors: those of StorageRoot::read_manifest; IoError when the root fails.
std::vector<BadChunk> verify_stored(const format::StorageRoot& root, const std::string& name);

}  // namespace tsnap::restore
