/// \file
/// Object storage's write side (s3_store.h), step by step. settled(): the store's manifest of
/// the name is this save's, or a newer save's: nothing to write; else that older manifest is
/// deleted first, so the older save stops being listed before any of its objects changes. A
/// file: its parts, read and checked chunk by chunk, go out kUploadThreads at once (an
/// interrupted upload of the key is resumed, keeping the parts whose size and MD5 match); a
/// failed upload stays resumable for the next pass. publish(): the manifest PUT with
/// If-None-Match; a manifest found there that is this one's exact bytes is a retry's (or, for a
/// shared save, another rank's) and counts as published; then the objects no file of this save
/// names (the older save's, the marks) are deleted.

#include "pipeline/s3_store.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>
#include <vector>

#include "common/run_parallel.h"
#include "format/layout.h"
#include "format/manifest_io.h"
#include "format/s3_root.h"
#include "io/crc32c.h"
#include "io/s3_client.h"
#include "tsnap/catalog.h"
#include "tsnap/error.h"

namespace tsnap::pipeline {
namespace {

class S3Store final : public DurableStore {
 public:
  explicit S3Store(DurableConfig config)
      : config_(std::move(config)), root_(config_.root.native()) {}

  bool remote() const override { return true; }

  std::vector<std::pair<std::string, std::string>> saves() override {
    std::vector<std::pair<std::string, std::string>> out;
    for (const Listed& l : root_.list()) {
      if (l.committed) out.emplace_back(l.name, l.manifest->id);
    }
    // Uploads a killed drain left: the newest of each key is resumed, the others aborted.
    std::map<std::string, io::S3Upload> newest;
    const io::S3Url& at = root_.location();
    for (const io::S3Upload& u : root_.client().list_multipart_uploads(
             at.bucket, at.prefix.empty() ? "" : at.prefix + "/")) {
      auto [it, fresh] = newest.emplace(u.key, u);
      // Shared saves: another rank may be resuming the older one; the store's lifecycle rule
      // for incomplete uploads takes what no drain completes.
      if (fresh || config_.node_rank >= 0) continue;
      const io::S3Upload stale =
          u.initiated > it->second.initiated ? std::exchange(it->second, u) : u;
      try {
        root_.client().abort_multipart_upload(at.bucket, stale.key, stale.upload_id);
      } catch (const Error&) {
        // gone already; a lifecycle rule of the store removes what stays
      }
    }
    for (const auto& [key, u] : newest) resumable_.emplace(key, u.upload_id);
    return out;
  }

  bool settled(const std::string& name, const Manifest& m) override {
    try {
      const std::optional<std::string> there_text = root_.manifest_text(name);
      if (!there_text) return false;
      const Manifest there = format::parse_manifest(*there_text, root_.url(name));
      if (there.id == m.id || format::newer(format::age_of(there), format::age_of(m))) return true;
    } catch (const FormatError&) {
      // Not a valid snapshot there: replaced below.
    }
    root_.client().delete_object(root_.location().bucket, root_.key(name, kManifestName));
    return false;
  }

  std::unique_ptr<DurableSave> begin(const std::string& name, const Manifest& m,
                                     bool shared) override;

  const format::S3Root& root() const { return root_; }

  // Uploads the file `src` reads as `key`; see the file comment.
  void upload(const CheckedSource& src, const std::string& key, DrainRecord& record) {
    const FileRecord& f = src.record();
    src.check_size();
    // Parts of whole chunks, at least 8 MiB (S3's minimum is 5 MiB), at most 10,000 of them.
    constexpr uint64_t kMinPart = 8ull << 20;
    const uint64_t chunk = std::max<uint64_t>(f.chunk_bytes, 1);
    uint64_t part_bytes = chunk * std::max<uint64_t>(1, (kMinPart + chunk - 1) / chunk);
    while ((f.size + part_bytes - 1) / part_bytes > 10000) part_bytes *= 2;
    const size_t parts =
        static_cast<size_t>(std::max<uint64_t>(1, (f.size + part_bytes - 1) / part_bytes));
    auto read_part = [&](size_t p, std::vector<uint8_t>& buffer) -> size_t {
      const uint64_t begin = p * part_bytes;
      const size_t len = static_cast<size_t>(std::min<uint64_t>(part_bytes, f.size - begin));
      buffer.resize(std::max<size_t>(len, 1));
      src.read(begin, len, buffer.data());
      return len;
    };
    io::S3Client& client = root_.client();
    const std::string& bucket = root_.location().bucket;
    if (parts == 1) {
      std::vector<uint8_t> buffer;
      const size_t len = read_part(0, buffer);
      config_.pace(len);
      client.put_object(bucket, key, buffer.data(), len);
      record.bytes += len;
      src.release();
      return;
    }
    std::string upload_id;
    std::map<int, io::S3Part> uploaded;  // what an interrupted drain left, by part number
    if (auto it = resumable_.find(key); it != resumable_.end()) {
      upload_id = it->second;
      resumable_.erase(it);
      try {
        for (const io::S3Part& p : client.list_parts(bucket, key, upload_id)) {
          uploaded[p.number] = p;
        }
      } catch (const Error& e) {
        if (e.code() != ErrorCode::kNotFound) throw;
        upload_id.clear();  // completed or aborted meanwhile
      }
    }
    if (upload_id.empty()) upload_id = client.create_multipart_upload(bucket, key);
    std::vector<io::S3Part> done(parts);
    std::vector<std::vector<uint8_t>> buffers(kUploadThreads);
    std::atomic<uint64_t> sent{0}, kept{0};
    try {
      detail::run_parallel(parts, kUploadThreads, [&](size_t p, int worker) {
        std::vector<uint8_t>& buffer = buffers[worker];
        const size_t len = read_part(p, buffer);
        const int number = static_cast<int>(p + 1);
        done[p].number = number;
        if (auto it = uploaded.find(number); it != uploaded.end() && it->second.size == len &&
                                             it->second.etag == io::md5_hex(buffer.data(), len)) {
          done[p] = it->second;
          if (done[p].crc32c.empty() && client.config().checksum == io::S3Checksum::kCrc32c) {
            done[p].crc32c = io::crc32c_base64(io::crc32c(buffer.data(), len));
          }
          kept += len;
          return;
        }
        config_.pace(len);
        done[p] = client.upload_part(bucket, key, upload_id, number, buffer.data(), len);
        sent += len;
      });
    } catch (...) {
      // Kept for the next pass (or the next process) to resume: its parts are not sent again.
      resumable_[key] = upload_id;
      throw;
    }
    client.complete_multipart_upload(bucket, key, upload_id, done);
    src.release();
    record.bytes += sent;
    record.resumed_bytes += kept;
  }

  // Publishes `text` as the manifest of save `m` of `name`; see the file comment.
  void publish(const std::string& name, const std::string& text, const Manifest& m,
               DrainRecord& record) {
    const std::string& bucket = root_.location().bucket;
    config_.pace(text.size());
    try {
      root_.client().put_object(bucket, root_.key(name, kManifestName), text.data(), text.size(),
                                /*if_absent=*/true);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kAlreadyExists) throw;
      if (root_.manifest_text(name) != std::optional<std::string>(text)) {
        throw_error(ErrorCode::kAlreadyExists,
                    "drain: another writer published snapshot " + root_.url(name) +
                        " while this one uploaded save " + m.id +
                        " of that name; this save is not in the store (the two wrote the same "
                        "objects: check the published one with `tsnap verify " +
                        root_.url(name) + "`)");
      }
    }
    record.bytes += text.size();
    std::vector<std::string> files;
    for (const FileRecord& f : m.files) files.push_back(f.name);
    try {
      root_.remove_other_objects(name, files);
    } catch (const Error&) {
      // Leftovers cost space only; the next replacement or removal of the name deletes them.
    }
  }

 private:
  const DurableConfig config_;
  const format::S3Root root_;
  std::map<std::string, std::string> resumable_;  // S3 key -> an interrupted upload's id
};

class S3Save final : public DurableSave {
 public:
  S3Save(S3Store& store, const std::string& name, const Manifest& m, bool shared)
      : store_(store),
        name_(name),
        m_(m),
        shared_(shared),
        marks_(store.root().key(name, kUploadedPrefix + m.id) + "/") {}

  std::set<std::string> in_place() override {
    std::set<std::string> names;
    if (!shared_) return names;
    const format::S3Root& root = store_.root();
    for (const io::S3Object& o : root.client().list(root.location().bucket, marks_).objects) {
      names.insert(o.key.substr(marks_.size()));
    }
    return names;
  }

  bool has(const FileRecord& f) override {
    const format::S3Root& root = store_.root();
    return shared_ && root.client().head_object(root.location().bucket, marks_ + f.name);
  }

  void write(const CheckedSource& src, DrainRecord& record) override {
    const format::S3Root& root = store_.root();
    store_.upload(src, root.key(name_, src.record().name), record);
    if (shared_)
      root.client().put_object(root.location().bucket, marks_ + src.record().name, "", 0);
  }

  bool publish(const std::string& text, DrainRecord& record) override {
    if (shared_) {
      const std::set<std::string> done = in_place();
      const bool complete = std::all_of(m_.files.begin(), m_.files.end(), [&](const FileRecord& f) {
        return done.count(f.name) != 0;
      });
      if (!complete) return false;  // a rank still uploading publishes it
    }
    store_.publish(name_, text, m_, record);
    return true;
  }

  std::string where(const FileRecord& f) const override {
    return store_.root().url(name_) + "/" + f.name;
  }

 private:
  S3Store& store_;
  const std::string name_;
  const Manifest& m_;
  const bool shared_;
  const std::string marks_;  // shared saves: the prefix of the marks of uploaded files
};

std::unique_ptr<DurableSave> S3Store::begin(const std::string& name, const Manifest& m,
                                            bool shared) {
  return std::make_unique<S3Save>(*this, name, m, shared);
}

}  // namespace

std::unique_ptr<DurableStore> make_s3_store(DurableConfig config) {
  return std::make_unique<S3Store>(std::move(config));
}

}  // namespace tsnap::pipeline
