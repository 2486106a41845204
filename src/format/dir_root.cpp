#include "format/dir_root.h"

#include <stdio.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <system_error>

#include "common/remove_tree.h"
#include "common/sys_error.h"
#include "format/layout.h"
#include "format/manifest_io.h"
#include "format/open_file.h"
#include "io/fd.h"
#include "tsnap/error.h"

namespace tsnap::format {

namespace fs = std::filesystem;

std::vector<Listed> DirRoot::list() const {
  std::vector<Listed> out;
  std::error_code ec;
  if (!fs::exists(root_, ec)) return out;
  fs::directory_iterator it(root_, ec);
  if (ec) {
    throw_error(ErrorCode::kIo, "cannot list " + root_.string() + ": " + ec.message(), ec.value());
  }
  std::vector<std::pair<int64_t, Listed>> sorted;
  for (const fs::directory_entry& entry : it) {
    if (!entry.is_directory(ec)) continue;
    Listed l;
    l.path = entry.path();
    l.name = entry.path().filename().string();
    l.temporary = looks_temporary(l.name);
    int64_t when = 0;
    if (!l.temporary) {
      try {
        l.manifest = read_manifest_in(SnapshotDir::open(l.path));
        l.committed = true;
        when = l.manifest->created_unix_ns;
      } catch (const Error& e) {
        l.problem = e.what();
      }
    } else {
      l.problem = "temporary directory of an unfinished save";
    }
    if (!l.committed) {
      const auto t = fs::last_write_time(l.path, ec);
      if (!ec) {
        when = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
      }
    }
    sorted.emplace_back(when, std::move(l));
  }
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second.name < b.second.name;
  });
  for (auto& [when, l] : sorted) out.push_back(std::move(l));
  return out;
}

std::optional<std::string> DirRoot::manifest_text(const std::string& name) const {
  try {
    return manifest_text_in(SnapshotDir::open(locate(name)));
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kNotFound) return std::nullopt;
    throw;
  }
}

Manifest DirRoot::read_manifest(const std::string& name) const {
  return read_manifest_in(SnapshotDir::open(locate(name)));
}

std::map<std::string, uint64_t> DirRoot::file_sizes(const std::string& name) const {
  std::map<std::string, uint64_t> sizes;
  std::error_code ec;
  fs::directory_iterator it(locate(name), ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory) return sizes;
    throw_error(ErrorCode::kIo, "cannot list " + locate(name).string() + ": " + ec.message(),
                ec.value());
  }
  for (const fs::directory_entry& entry : it) {
    if (!entry.is_regular_file(ec)) continue;
    const uintmax_t size = entry.file_size(ec);
    if (!ec) sizes.emplace(entry.path().filename().string(), static_cast<uint64_t>(size));
  }
  return sizes;
}

void DirRoot::read(const std::string& name, const std::string& file, uint64_t offset, void* out,
                   size_t n) const {
  const SnapshotDir dir = SnapshotDir::open(locate(name));
  const OpenedFile f = open_snapshot_file(dir, file, "file");
  const int64_t got = io::read_full(f.fd.get(), out, n, offset);
  if (got < 0) detail::throw_sys_error(static_cast<int>(got), "read " + dir.label(file));
  if (static_cast<size_t>(got) != n) {
    throw_error(ErrorCode::kTruncated, dir.label(file) + " ends at byte " +
                                           std::to_string(offset + static_cast<uint64_t>(got)) +
                                           ", before byte " + std::to_string(offset + n));
  }
}

fs::path DirRoot::remove(const std::string& name,
                         const std::function<void(const fs::path&)>& unlisted) const {
  const fs::path snapshot = locate(name);
  fs::path temporary = root_ / temporary_name(name, new_save_id());
  if (::rename(snapshot.c_str(), temporary.c_str()) != 0) {
    const int e = errno;
    if (e == ENOENT) {
      throw_error(ErrorCode::kNotFound, "snapshot " + snapshot.string() + " does not exist", e);
    }
    detail::throw_sys_error(-e, "rename " + snapshot.string() + " to " + temporary.string());
  }
  if (unlisted) unlisted(temporary);
  (void)detail::remove_tree(temporary.string());
  return temporary;
}

bool holds_every_file(const fs::path& snapshot, const Manifest& m) {
  for (const FileRecord& f : m.files) {
    struct stat st {};
    if (::stat((snapshot / f.name).c_str(), &st) != 0 ||
        static_cast<uint64_t>(st.st_size) != f.size) {
      return false;
    }
  }
  return true;
}

}  // namespace tsnap::format
