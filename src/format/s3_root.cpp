#include "format/s3_root.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "format/layout.h"
#include "format/manifest_io.h"
#include "tsnap/error.h"

namespace tsnap::format {

bool is_s3(const std::filesystem::path& path) { return io::S3Url::is_s3(path.native()); }

std::shared_ptr<io::S3Client> s3_client() {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<io::S3Client>> clients;
  io::S3Config config = io::S3Config::from_environment();
  // One client per distinct configuration: every field of it.
  std::string key;
  for (const std::string* s : {&config.endpoint, &config.region, &config.access_key,
                               &config.secret_key, &config.session_token, &config.ca_bundle}) {
    key += std::to_string(s->size()) + ":" + *s;
  }
  for (const long v :
       {config.connect_timeout_ms, config.timeout_ms, config.min_speed,
        static_cast<long>(config.attempts), config.retry_ms, static_cast<long>(config.path_style),
        static_cast<long>(config.verify_etag)}) {
    key += "/" + std::to_string(v);
  }
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<io::S3Client>& client = clients[key];
  if (!client) client = std::make_shared<io::S3Client>(std::move(config));
  return client;
}

S3Root::S3Root(const std::string& url) : url_(io::S3Url::parse(url)), client_(s3_client()) {}

std::pair<S3Root, std::string> S3Root::of_snapshot(const std::string& url) {
  io::S3Url parsed = io::S3Url::parse(url);
  const size_t slash = parsed.prefix.rfind('/');
  const std::string name =
      slash == std::string::npos ? parsed.prefix : parsed.prefix.substr(slash + 1);
  if (name.empty()) {
    throw_error(ErrorCode::kInvalidArgument,
                url + " names a bucket, not a snapshot (s3://bucket/prefix/<name>)");
  }
  check_snapshot_name(name);
  const std::string root_prefix = slash == std::string::npos ? "" : parsed.prefix.substr(0, slash);
  return {S3Root("s3://" + parsed.bucket + (root_prefix.empty() ? "" : "/" + root_prefix)), name};
}

std::string S3Root::url(const std::string& name) const { return url_.str() + "/" + name; }

std::string S3Root::key(const std::string& name, const std::string& file) const {
  return url_.key(name + "/" + file);
}

std::vector<Listed> S3Root::list() const {
  const std::string base = url_.prefix.empty() ? "" : url_.prefix + "/";
  const io::S3Listing listing = client_->list(url_.bucket, base, "/");
  std::vector<std::pair<int64_t, Listed>> sorted;
  for (const std::string& prefix : listing.prefixes) {
    Listed l;
    l.name = prefix.substr(base.size());
    if (!l.name.empty() && l.name.back() == '/') l.name.pop_back();
    if (l.name.empty()) continue;
    l.path = url(l.name);
    int64_t when = 0;
    try {
      check_snapshot_name(l.name);
      if (std::optional<std::string> text = manifest_text(l.name)) {
        l.manifest = parse_manifest(*text, l.path.string() + "/" + kManifestName);
        l.committed = true;
        when = l.manifest->created_unix_ns;
      } else {
        l.temporary = true;
        l.problem = "objects without a MANIFEST.json: an upload in progress or interrupted";
      }
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kIo) throw;  // the store, not the snapshot
      l.problem = e.what();
    }
    sorted.emplace_back(when, std::move(l));
  }
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second.name < b.second.name;
  });
  std::vector<Listed> out;
  out.reserve(sorted.size());
  for (auto& [when, l] : sorted) out.push_back(std::move(l));
  return out;
}

std::optional<std::string> S3Root::manifest_text(const std::string& name) const {
  const std::string key = this->key(name, kManifestName);
  // A manifest replaced between the HEAD and the GET (a drain of a newer save of the name)
  // fails the GET's If-Match: HEAD it again.
  for (int tries = 1;; ++tries) {
    const std::optional<io::S3Object> head = client_->head_object(url_.bucket, key);
    if (!head) return std::nullopt;
    if (head->size > kMaxManifestBytes) {
      throw_error(ErrorCode::kBadManifest,
                  url(name) + "/" + kManifestName + " has " + std::to_string(head->size) +
                      " bytes, more than the cap of " + std::to_string(kMaxManifestBytes));
    }
    try {
      return client_->get_object(url_.bucket, *head);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kNotFound || tries == 3) throw;
    }
  }
}

std::map<std::string, uint64_t> S3Root::file_sizes(const std::string& name) const {
  const std::string base = url_.key(name + "/");
  std::map<std::string, uint64_t> sizes;
  for (const io::S3Object& o : client_->list(url_.bucket, base).objects) {
    const std::string file = o.key.substr(base.size());
    if (file.find('/') == std::string::npos) sizes.emplace(file, o.size);
  }
  return sizes;
}

void S3Root::read(const std::string& name, const std::string& file, uint64_t offset, void* out,
                  size_t n) const {
  client_->get_range(url_.bucket, key(name, file), offset, out, n);
}

std::filesystem::path S3Root::remove(
    const std::string& name,
    const std::function<void(const std::filesystem::path&)>& unlisted) const {
  const std::string base = url_.key(name + "/");
  const io::S3Listing listing = client_->list(url_.bucket, base);
  if (listing.objects.empty()) {
    throw_error(ErrorCode::kNotFound, "snapshot " + url(name) + " does not exist");
  }
  client_->delete_object(url_.bucket, key(name, kManifestName));  // no longer committed
  if (unlisted) unlisted(locate(name));
  std::vector<std::string> keys;
  for (const io::S3Object& o : listing.objects) keys.push_back(o.key);
  client_->delete_objects(url_.bucket, keys);
  return locate(name);
}

void S3Root::remove_other_objects(const std::string& name,
                                  const std::vector<std::string>& keep) const {
  const std::string base = url_.key(name + "/");
  std::vector<std::string> stale;
  for (const io::S3Object& o : client_->list(url_.bucket, base).objects) {
    const std::string file = o.key.substr(base.size());
    if (file == kManifestName) continue;
    if (std::find(keep.begin(), keep.end(), file) == keep.end()) stale.push_back(o.key);
  }
  if (!stale.empty()) client_->delete_objects(url_.bucket, stale);
}

}  // namespace tsnap::format
