#include "tsnap/manifest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "format/manifest_io.h"
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
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) {
      throw Error(ErrorCode::kNotFound, "no manifest: " + name + " does not exist", e);
    }
    throw IoError(ErrorCode::kIo, "cannot open " + name + ": " + std::strerror(e), e);
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};

  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    throw IoError(ErrorCode::kIo, "fstat " + name + " failed: " + std::strerror(e), e);
  }
  if (!S_ISREG(st.st_mode)) {
    throw FormatError(ErrorCode::kBadManifest, "" + name + " is not a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > format::kMaxManifestBytes) {
    throw FormatError(ErrorCode::kBadManifest, "" + name + " has " + std::to_string(size) +
                                                   " bytes, more than the cap of " +
                                                   std::to_string(format::kMaxManifestBytes) +
                                                   " bytes on manifests");
  }
  // A committed manifest never changes; if the file shrank meanwhile, the JSON check fails.
  std::string text(size, '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t r = ::read(fd, text.data() + got, text.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int e = errno;
      throw IoError(ErrorCode::kIo, "read " + name + " failed: " + std::strerror(e), e);
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  text.resize(got);
  return format::parse_manifest(text, name);
}

}  // namespace tsnap
