/// \file
/// A directory's write side, step by step. A save alone:
///   1. mkdir `<root>/.<name>.tmp-<fresh id>`;
///   2. each file: a hard link from the durable copy of the snapshot an incremental save reused
///      it from (same size, header id and chunk hashes), else created (O_EXCL) and written
///      chunk by chunk, each chunk checked before any of it is written, in pieces of 1 MiB
///      paced to the rate; fsynced and closed;
///   3. commit_directory (commit.cpp steps 3-7) with overwrite: the manifest last, one atomic
///      exchange with a durable snapshot of that name.
/// A throw before step 3's rename removes the temporary directory (the save's destructor).
/// A shared save writes each file as `.<file>.part-r<rank>` and renames it into place without
/// replacing (a rank that placed it first wins; the copy is dropped), and its publication takes
/// the directory's flock, looks again whether the save is settled or incomplete, removes part
/// files of killed copies and the manifest of a commit killed before its rename, and commits.

#include "pipeline/dir_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <optional>
#include <system_error>
#include <vector>

#include "common/sys_error.h"
#include "format/layout.h"
#include "io/fd.h"
#include "pipeline/commit.h"
#include "pipeline/root_lock.h"
#include "tsnap/catalog.h"
#include "tsnap/error.h"

namespace tsnap::pipeline {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kPieceBytes = 1ull << 20;  // pacing and write granularity

void check(int rc, const std::string& what) {
  if (rc < 0) detail::throw_sys_error(rc, what);
}

// Closes a durable file through the engine on every path.
class EngineFd {
 public:
  EngineFd(io::Engine& engine, int fd) : engine_(engine), fd_(fd) {}
  ~EngineFd() {
    if (fd_ >= 0) (void)engine_.close(fd_);
  }
  EngineFd(const EngineFd&) = delete;
  EngineFd& operator=(const EngineFd&) = delete;
  int get() const { return fd_; }
  int close() { return engine_.close(std::exchange(fd_, -1)); }

 private:
  io::Engine& engine_;
  int fd_;
};

class DirStore final : public DurableStore {
 public:
  explicit DirStore(DurableConfig config) : config_(std::move(config)) {
    std::error_code ec;
    fs::create_directories(config_.root, ec);
    if (ec) {
      throw_error(ErrorCode::kIo,
                  "cannot create durable root " + config_.root.string() + ": " + ec.message(),
                  ec.value());
    }
    lock_.emplace(config_.root);  // removes stale temporaries when no other writer is alive
  }

  bool remote() const override { return false; }

  std::vector<std::pair<std::string, std::string>> saves() override {
    std::vector<std::pair<std::string, std::string>> out;
    for (const Listed& l : list(config_.root)) {
      if (l.committed) out.emplace_back(l.name, l.manifest->id);
    }
    return out;
  }

  bool settled(const std::string& name, const Manifest& m) override {
    std::error_code ec;
    const fs::path final_path = config_.root / name;
    if (!fs::exists(final_path, ec)) return false;
    try {
      const Manifest there = read_manifest(final_path);
      if (there.id != m.id && !format::newer(format::age_of(there), format::age_of(m))) {
        return false;
      }
    } catch (const Error&) {
      return false;  // not a valid snapshot there: the commit replaces it
    }
    // Published (by another rank of a shared save, too) or superseded: a shared temporary
    // of this save has nothing left to complete.
    remove_temporary(share_path(name, m.id));
    return true;
  }

  std::unique_ptr<DurableSave> begin(const std::string& name, const Manifest& m,
                                     bool shared) override;

  const DurableConfig& config() const { return config_; }
  std::string share_path(const std::string& name, const std::string& id) const {
    return config_.root.string() + "/" + format::temporary_name(name, id) + kShareSuffix;
  }

 private:
  const DurableConfig config_;
  std::optional<RootLock> lock_;
};

class DirSave final : public DurableSave {
 public:
  DirSave(DirStore& store, const std::string& name, const Manifest& m, bool shared)
      : store_(store),
        engine_(*store.config().engine),
        name_(name),
        m_(m),
        shared_(shared),
        paths_{store.config().root.string(),
               shared ? store.share_path(name, m.id)
                      : store.config().root.string() + "/" +
                            format::temporary_name(name, format::new_save_id()),
               (store.config().root / name).string()} {
    const int rc = engine_.mkdir(paths_.temporary);
    if (rc < 0 && !(shared_ && rc == -EEXIST)) {
      detail::throw_sys_error(rc, "create directory " + paths_.temporary);
    }
    made_ = true;
  }
  ~DirSave() override {
    // A save alone that did not commit leaves nothing; a shared one stays for the other ranks.
    if (made_ && !shared_ && !published_) remove_temporary(paths_.temporary);
  }

  std::set<std::string> in_place() override {
    std::set<std::string> out;
    for (const FileRecord& f : m_.files) {
      if (has(f)) out.insert(f.name);
    }
    return out;
  }

  bool has(const FileRecord& f) override {
    struct stat st {};
    return ::stat((paths_.temporary + "/" + f.name).c_str(), &st) == 0 &&
           static_cast<uint64_t>(st.st_size) == f.size;
  }

  // An incremental save's file reused whole from snapshot X (FileRecord::reused_from) is the
  // same bytes as X's file of that name; when the durable root holds X with that file (same
  // size, header id and chunk hashes), a hard link replaces the copy, so incremental snapshots
  // stay incremental in the durable root too. Anything else (no X there, a different save of
  // X, links refused) is written.
  bool link(const FileRecord& f) override {
    if (shared_ || f.reused_from.empty()) return false;
    try {
      format::check_snapshot_name(f.reused_from);  // a plain name under the durable root
    } catch (const Error&) {
      return false;
    }
    const fs::path root = store_.config().root;
    auto it = bases_.find(f.reused_from);
    if (it == bases_.end()) {
      std::optional<Manifest> base;
      try {
        base = read_manifest(root / f.reused_from);
      } catch (const Error&) {
      }
      it = bases_.emplace(f.reused_from, std::move(base)).first;
    }
    if (!it->second) return false;
    const Manifest& base = *it->second;
    const FileRecord* there = base.find_file(f.name);
    if (there == nullptr || there->size != f.size || there->chunk_bytes != f.chunk_bytes ||
        there->chunk_hashes != f.chunk_hashes || there->header_id(base.id) != f.header_id(m_.id)) {
      return false;
    }
    const fs::path from = root / f.reused_from / f.name;
    return ::link(from.c_str(), (paths_.temporary + "/" + f.name).c_str()) == 0;
  }

  void write(const CheckedSource& src, DrainRecord& record) override {
    const FileRecord& f = src.record();
    src.check_size();
    const std::string final_path = paths_.temporary + "/" + f.name;
    const std::string to = shared_ ? paths_.temporary + "/." + f.name + ".part-r" +
                                         std::to_string(store_.config().node_rank)
                                   : final_path;
    if (shared_) ::unlink(to.c_str());  // a killed copy's
    const int fd = engine_.open(to, O_WRONLY | O_CREAT | O_EXCL, 0644);
    check(fd, "create " + to);
    EngineFd dst(engine_, fd);
    std::vector<uint8_t> buffer(std::max<size_t>(f.chunk_bytes, 1));
    for (size_t i = 0; i < f.chunk_hashes.size(); ++i) {
      const uint64_t offset = i * f.chunk_bytes;
      const size_t len = static_cast<size_t>(std::min<uint64_t>(f.chunk_bytes, f.size - offset));
      src.read(offset, len, buffer.data());
      for (size_t p = 0; p < len; p += kPieceBytes) {
        const size_t piece = static_cast<size_t>(std::min<uint64_t>(kPieceBytes, len - p));
        store_.config().pace(piece);
        check(io::write_and_wait(engine_, dst.get(), buffer.data() + p, piece, offset + p),
              "write " + to);
      }
    }
    check(engine_.fsync(dst.get()), "fsync " + to);
    check(dst.close(), "close " + to);
    src.release();
    record.bytes += f.size;
    if (!shared_) return;
    const int moved = engine_.rename(to, final_path, io::RenameMode::kNoReplace);
    if (moved == -EEXIST) ::unlink(to.c_str());  // placed by another rank meanwhile
    check(moved == -EEXIST ? 0 : moved, "rename " + to + " into place");
  }

  bool publish(const std::string& text, DrainRecord& record) override {
    if (!shared_) {
      std::string leftover;
      record.bytes += commit_directory(engine_, paths_, text, /*overwrite=*/true, &leftover);
      published_ = true;
      return true;
    }
    // Whoever finds every file in place commits, under the temporary directory's lock.
    const io::UniqueFd dir_fd(::open(paths_.temporary.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dir_fd.valid()) {
      const int err = errno;
      if (err == ENOENT && store_.settled(name_, m_)) return false;  // committed
      detail::throw_sys_error(-err, "open " + paths_.temporary);
    }
    const io::FileLock lock(dir_fd.get(), /*try_only=*/false);
    if (!lock.locked()) detail::throw_sys_error(-lock.error(), "lock " + paths_.temporary);
    if (store_.settled(name_, m_) || !std::all_of(m_.files.begin(), m_.files.end(),
                                                  [&](const FileRecord& f) { return has(f); })) {
      return false;  // committed by another rank, or a rank still copying commits
    }
    // Part files of killed copies, and the manifest of a commit killed before its rename.
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(paths_.temporary, ec)) {
      const std::string entry = e.path().filename().string();
      if (entry.rfind('.', 0) == 0 || entry == kManifestName) ::unlink(e.path().c_str());
    }
    std::string leftover;
    record.bytes += commit_directory(engine_, paths_, text, /*overwrite=*/true, &leftover);
    published_ = true;
    return true;
  }

  std::string where(const FileRecord& f) const override {
    return (store_.config().root / name_ / f.name).string();
  }

 private:
  DirStore& store_;
  io::Engine& engine_;
  const std::string name_;
  const Manifest& m_;
  const bool shared_;
  const CommitPaths paths_;
  bool made_ = false;
  bool published_ = false;
  std::map<std::string, std::optional<Manifest>> bases_;  // durable manifests, by name
};

std::unique_ptr<DurableSave> DirStore::begin(const std::string& name, const Manifest& m,
                                             bool shared) {
  return std::make_unique<DirSave>(*this, name, m, shared);
}

}  // namespace

std::unique_ptr<DurableStore> make_dir_store(DurableConfig config) {
  return std::make_unique<DirStore>(std::move(config));
}

}  // namespace tsnap::pipeline
