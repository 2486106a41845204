#include "tsnap/manifest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "format/manifest_io.h"
#include "format/open_file.h"
#include "format/storage_root.h"
#include "io/fd.h"
#include "tsnap/error.h"

namespace tsnap {

int64_t TensorRecord::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const TensorRecord* Manifest::find(const std::string& name) const {
  auto it = std::find_if(tensors.begin(), tensors.end(),
                         [&](const TensorRecord& t) { return t.name == name; });
  return it == tensors.end() ? nullptr : &*it;
}

std::vector<const TensorRecord*> Manifest::pieces(const std::string& name) const {
  std::vector<const TensorRecord*> out;
  for (const TensorRecord& t : tensors) {
    if (t.name == name) out.push_back(&t);
  }
  return out;
}

const FileRecord* Manifest::find_file(const std::string& name) const {
  auto it =
      std::find_if(files.begin(), files.end(), [&](const FileRecord& f) { return f.name == name; });
  return it == files.end() ? nullptr : &*it;
}

uint64_t Manifest::total_bytes() const {
  uint64_t total = 0;
  for (const auto& f : files) total += f.size;
  return total;
}

namespace format {

std::string manifest_text_in(const SnapshotDir& dir) {
  const std::string name = dir.label(kManifestName);
  const OpenedFile f = open_snapshot_file(dir, kManifestName, "manifest");
  const uint64_t size = f.size();
  if (size > kMaxManifestBytes) {
    throw_error(ErrorCode::kBadManifest,
                "" + name + " has " + std::to_string(size) + " bytes, more than the cap of " +
                    std::to_string(kMaxManifestBytes) + " bytes on manifests");
  }
  // A committed manifest never changes; if the file shrank meanwhile, the JSON check fails.
  std::string text(size, '\0');
  const int64_t got = io::read_full(f.fd.get(), text.data(), text.size(), 0);
  if (got < 0) {
    const int e = static_cast<int>(-got);
    throw_error(ErrorCode::kIo, "read " + name + " failed: " + std::strerror(e), e);
  }
  text.resize(static_cast<size_t>(got));
  return text;
}

Manifest read_manifest_in(const SnapshotDir& dir) {
  return parse_manifest(manifest_text_in(dir), dir.label(kManifestName));
}

}  // namespace format

Manifest read_manifest(const std::filesystem::path& dir) {
  const auto [root, name] = format::StorageRoot::of_snapshot(dir);
  return root->read_manifest(name);
}

}  // namespace tsnap
