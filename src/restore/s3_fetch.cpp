#include "restore/s3_fetch.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>

#include "common/remove_tree.h"
#include "common/run_parallel.h"
#include "common/sys_error.h"
#include "format/hash.h"
#include "format/layout.h"
#include "format/manifest_io.h"
#include "io/fd.h"
#include "tsnap/error.h"

namespace tsnap::restore {
namespace {

namespace fs = std::filesystem;

struct ChunkTask {
  size_t file;
  uint64_t chunk;
};

uint64_t chunk_length(const FileRecord& f, uint64_t chunk) {
  return std::min(f.chunk_bytes, f.size - chunk * f.chunk_bytes);
}

std::string chunk_label(const std::string& object, const FileRecord& f, uint64_t chunk) {
  const uint64_t begin = chunk * f.chunk_bytes;
  return "chunk " + std::to_string(chunk) + " of " + object + " (bytes [" + std::to_string(begin) +
         ", " + std::to_string(begin + chunk_length(f, chunk)) + "))";
}

// Runs `work(task, buffer)` for every task on kFetchThreads threads; each thread's buffer
// grows to the largest chunk it is given (chunks the objects were checked to hold).
template <typename Work>
void for_each_chunk(const Manifest& m, const std::vector<ChunkTask>& tasks, Work work) {
  std::vector<std::vector<uint8_t>> buffers(kFetchThreads);
  detail::run_parallel(tasks.size(), kFetchThreads, [&](size_t i, int worker) {
    std::vector<uint8_t>& buffer = buffers[worker];
    const uint64_t len = chunk_length(m.files[tasks[i].file], tasks[i].chunk);
    if (buffer.size() < len) buffer.resize(len);
    work(tasks[i], buffer.data());
  });
}

void check(int rc, const std::string& what) {
  if (rc < 0) detail::throw_sys_error(rc, what);
}

}  // namespace

namespace {

// Checks that every object of the files `which` (indexes into m.files) is there and of the
// manifest's size, before anything is allocated for them.
void check_objects(const format::S3Root& root, const std::string& name, const Manifest& m,
                   const std::vector<size_t>& which) {
  const std::map<std::string, uint64_t> sizes = root.file_sizes(name);
  for (size_t i : which) {
    const FileRecord& f = m.files[i];
    const std::string object = root.url(name) + "/" + f.name;
    const auto it = sizes.find(f.name);
    if (it == sizes.end()) throw_error(ErrorCode::kNotFound, object + " does not exist");
    if (it->second != f.size) {
      throw_error(it->second < f.size ? ErrorCode::kTruncated : ErrorCode::kBadManifest,
                  object + " is " + std::to_string(it->second) + " bytes, the manifest says " +
                      std::to_string(f.size));
    }
  }
}

// Copies the chunks `tasks` of snapshot `name` into the shard files under `dir` (which exists),
// each by a ranged GET, checked against its hash before it is written; the files are made at
// their full size where they are not there yet (a chunk not fetched stays a hole). Not fsynced:
// every copy is a temporary one, read at once from the page cache and removed afterwards.
void fetch_chunks(const format::S3Root& root, const std::string& name, const Manifest& m,
                  const fs::path& dir, const std::vector<ChunkTask>& tasks) {
  std::vector<size_t> which;
  for (const ChunkTask& t : tasks) {
    if (std::find(which.begin(), which.end(), t.file) == which.end()) which.push_back(t.file);
  }
  check_objects(root, name, m, which);
  std::vector<io::UniqueFd> fds(m.files.size());
  for (size_t i : which) {
    const FileRecord& f = m.files[i];
    int err = 0;
    const std::string path = (dir / f.name).string();
    fds[i] = io::open_fd(path, O_WRONLY | O_CREAT, 0644, &err);
    check(err, "open " + path);
    struct stat st {};
    check(::fstat(fds[i].get(), &st) == 0 ? 0 : -errno, "stat " + path);
    if (static_cast<uint64_t>(st.st_size) != f.size) {
      check(::ftruncate(fds[i].get(), static_cast<off_t>(f.size)) == 0 ? 0 : -errno,
            "size " + path);
    }
  }
  io::S3Client& client = root.client();
  const std::string bucket = root.location().bucket;
  for_each_chunk(m, tasks, [&](const ChunkTask& t, uint8_t* buffer) {
    const FileRecord& f = m.files[t.file];
    const uint64_t offset = t.chunk * f.chunk_bytes;
    const uint64_t len = chunk_length(f, t.chunk);
    const std::string object = root.url(name) + "/" + f.name;
    client.get_range(bucket, root.key(name, f.name), offset, buffer, len);
    const uint64_t hash = format::hash64(buffer, len);
    if (hash != f.chunk_hashes[t.chunk]) {
      throw_error(ErrorCode::kHashMismatch, chunk_label(object, f, t.chunk) + " has XXH3-64 " +
                                                format::hash_hex(hash) + ", the manifest says " +
                                                format::hash_hex(f.chunk_hashes[t.chunk]));
    }
    const ssize_t n = ::pwrite(fds[t.file].get(), buffer, len, static_cast<off_t>(offset));
    if (n != static_cast<ssize_t>(len)) {
      detail::throw_sys_error(n < 0 ? -errno : -EIO, "write " + (dir / f.name).string());
    }
  });
  for (size_t i : which) {
    const std::string path = (dir / m.files[i].name).string();
    check(fds[i].close(), "close " + path);
  }
}

void write_manifest(const std::string& text, const fs::path& dir) {
  const std::string manifest = (dir / kManifestName).string();
  int err = 0;
  io::UniqueFd out = io::open_fd(manifest, O_WRONLY | O_CREAT | O_EXCL, 0644, &err);
  check(err, "create " + manifest);
  if (::write(out.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    detail::throw_sys_error(-errno, "write " + manifest);
  }
  check(out.close(), "close " + manifest);
}

}  // namespace

void fetch(const format::S3Root& root, const std::string& name, const Manifest& m,
           const std::string& text, const fs::path& dir) {
  if (::mkdir(dir.c_str(), 0755) != 0) detail::throw_sys_error(-errno, "create " + dir.string());
  std::vector<ChunkTask> all;
  for (size_t i = 0; i < m.files.size(); ++i) {
    for (uint64_t c = 0; c < m.files[i].chunk_hashes.size(); ++c) all.push_back({i, c});
  }
  fetch_chunks(root, name, m, dir, all);
  write_manifest(text, dir);
}

FetchedSnapshot::FetchedSnapshot(const std::string& url) {
  const std::pair<format::S3Root, std::string> at = format::S3Root::of_snapshot(url);
  const format::S3Root& root = at.first;
  name_ = at.second;
  const std::optional<std::string> text = root.manifest_text(name_);
  if (!text) throw_error(ErrorCode::kNotFound, "snapshot " + url + " does not exist (no manifest)");
  manifest_ = format::parse_manifest(*text, url + "/" + kManifestName);
  const char* env = std::getenv("TSNAP_FETCH_DIR");
  const fs::path parent =
      env != nullptr && *env != '\0' ? fs::path(env) : fs::temp_directory_path();
  top_ = parent / ("tsnap-fetch-" + format::new_save_id());
  if (::mkdir(top_.c_str(), 0700) != 0) detail::throw_sys_error(-errno, "create " + top_.string());
  snapshot_ = top_ / name_;
  try {
    fetch(root, name_, manifest_, *text, snapshot_);
  } catch (...) {
    (void)detail::remove_tree(top_.string());
    throw;
  }
}

FetchedSnapshot::~FetchedSnapshot() { (void)detail::remove_tree(top_.string()); }

std::vector<BadChunk> verify_stored(const format::StorageRoot& root, const std::string& name) {
  const Manifest m = root.read_manifest(name);
  // A chunk past the end of its object (or of a missing one) is reported without a GET, so
  // nothing is allocated for what a manifest claims beyond the objects.
  const std::map<std::string, uint64_t> sizes = root.file_sizes(name);
  std::vector<BadChunk> bad;
  std::vector<ChunkTask> tasks;
  for (size_t i = 0; i < m.files.size(); ++i) {
    const FileRecord& f = m.files[i];
    const auto it = sizes.find(f.name);
    for (uint64_t c = 0; c < f.chunk_hashes.size(); ++c) {
      const uint64_t offset = c * f.chunk_bytes;
      if (it == sizes.end()) {
        bad.push_back({f.name, c, offset, "missing object"});
      } else if (offset + chunk_length(f, c) > it->second) {
        bad.push_back({f.name, c, offset, "truncated"});
      } else {
        tasks.push_back({i, c});
      }
    }
  }
  std::mutex mu;
  for_each_chunk(m, tasks, [&](const ChunkTask& t, uint8_t* buffer) {
    const FileRecord& f = m.files[t.file];
    const uint64_t offset = t.chunk * f.chunk_bytes;
    const uint64_t len = chunk_length(f, t.chunk);
    std::string problem;
    try {
      root.read(name, f.name, offset, buffer, static_cast<size_t>(len));
      if (format::hash64(buffer, len) != f.chunk_hashes[t.chunk]) problem = "hash mismatch";
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kNotFound && e.code() != ErrorCode::kTruncated) throw;
      problem = e.code() == ErrorCode::kNotFound ? "missing object" : "truncated";
    }
    if (!problem.empty()) {
      std::lock_guard<std::mutex> lock(mu);
      bad.push_back({f.name, t.chunk, offset, problem});
    }
  });
  std::sort(bad.begin(), bad.end(), [](const BadChunk& a, const BadChunk& b) {
    return a.file != b.file ? a.file < b.file : a.chunk < b.chunk;
  });
  return bad;
}

}  // namespace tsnap::restore
