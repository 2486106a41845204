#pragma once
/// \file
/// Object storage as a durable root's write side (pipeline/durable_store.h), a root
/// "s3://bucket/prefix" (format/s3_root.h). Each file becomes the object
/// `<prefix>/<name>/<file>`: one PUT when it fits in a part, else a multipart upload of parts
/// of whole chunks, kUploadThreads at once, each chunk checked before its part leaves. Uploads a
/// killed drain left are listed once (DurableStore::saves) and resumed: a part is kept when its
/// size and MD5 match the local bytes; stale ones of the same key are aborted. Publishing
/// deletes nothing first (settled() unlisted an older save of the name already), PUTs the
/// manifest only where none is (If-None-Match), then deletes the older save's other objects.
/// A shared save (node-local roots) marks each uploaded file with an empty object
/// `<name>/.uploaded-<id>/<file>` after its upload completed; it is published once every file
/// has its mark, and the marks go with the older objects.

#include <memory>

#include "pipeline/durable_store.h"

namespace tsnap::pipeline {

/// Parts of one file uploaded to object storage at once.
inline constexpr int kUploadThreads = 4;
/// The marks of a shared save's uploaded files are the objects
/// `<prefix>/<name>/.uploaded-<id>/<file>`.
inline constexpr const char* kUploadedPrefix = ".uploaded-";

/// The store of `config.root` ("s3://bucket/prefix"). Errors: InvalidArgument for a bad URL.
std::unique_ptr<DurableStore> make_s3_store(DurableConfig config);

}  // namespace tsnap::pipeline
