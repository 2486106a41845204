#include "tsnap/manifest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "format/manifest_io.h"
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

Manifest read_manifest(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / kManifestName;
  const std::string name = path.string();
  int err = 0;
  const io::UniqueFd fd = io::open_fd(name, O_RDONLY, 0, &err);
  if (err < 0) {
    const int e = -err;
    if (e == ENOENT) {
      throw_error(ErrorCode::kNotFound, "no manifest: " + name + " does not exist", e);
    }
    throw_error(ErrorCode::kIo, "cannot open " + name + ": " + std::strerror(e), e);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    const int e = errno;
    throw_error(ErrorCode::kIo, "fstat " + name + " failed: " + std::strerror(e), e);
  }
  if (!S_ISREG(st.st_mode)) {
    throw_error(ErrorCode::kBadManifest, "" + name + " is not a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > format::kMaxManifestBytes) {
    throw_error(ErrorCode::kBadManifest,
                "" + name + " has " + std::to_string(size) + " bytes, more than the cap of " +
                    std::to_string(format::kMaxManifestBytes) + " bytes on manifests");
  }
  // A committed manifest never changes; if the file shrank meanwhile, the JSON check fails.
  std::string text(size, '\0');
  const int64_t got = io::read_full(fd.get(), text.data(), text.size(), 0);
  if (got < 0) {
    const int e = static_cast<int>(-got);
    throw_error(ErrorCode::kIo, "read " + name + " failed: " + std::strerror(e), e);
  }
  text.resize(static_cast<size_t>(got));
  return format::parse_manifest(text, name);
}

}  // namespace tsnap
