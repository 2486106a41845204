#include "io/s3_client.h"

#include <curl/curl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "common/hex.h"
#include "io/crc32c.h"
#include "tsnap/error.h"

namespace tsnap::io {

namespace s3_detail {

struct Request {
  Request(const char* m, std::string o, std::string b, std::string k = {}, std::string qs = {})
      : method(m),
        op(std::move(o)),
        bucket(std::move(b)),
        key(std::move(k)),
        query(std::move(qs)) {}
  const char* method;          // GET, HEAD, PUT, POST, DELETE
  std::string op;              // for messages: "could not <op> s3://bucket/key"
  std::string bucket, key;     // an empty key addresses the bucket
  std::string query;           // canonical (see canonical_query)
  const void* body = nullptr;  // PUT/POST payload, borrowed
  size_t body_size = 0;
  bool data_body = false;            // object data: UNSIGNED-PAYLOAD and a checksum (else hashed)
  std::string md5_base64, md5_hex;   // object data: its MD5 (S3Checksum::kMd5), once for all tries
  std::string crc32c;                // object data: its CRC-32C in base64 (S3Checksum::kCrc32c)
  std::vector<std::string> headers;  // extra, "lower-case-name: value" (all signed)
  void* out = nullptr;               // ranged GET: the 206 body goes here...
  size_t out_size = 0;               // ...at most this many bytes
  size_t body_cap = kMaxXmlBytes;    // the most bytes of a 2xx body kept in Response::body
  bool error_in_200 = false;         // a 200 whose body is <Error> failed (CompleteMultipartUpload)
  bool slow_answer = false;  // the server may think for minutes, sending spaces (Complete...)
  const char* content_type = "application/xml";  // of a PUT/POST body
};

struct Response {
  CURL* curl = nullptr;  // during the transfer only
  bool no_body = false;  // a HEAD: Content-Length is the object's, not a body's
  long status = 0;
  std::string body;    // the body, unless it went to Request::out
  std::string etag;    // without quotes
  std::string crc32c;  // x-amz-checksum-crc32c, when the server gave one
  int64_t content_length = -1;
  void* out = nullptr;  // Request::out, Request::out_size
  size_t out_size = 0;
  size_t out_written = 0;
  size_t body_cap = 0;        // Request::body_cap
  std::string refused;        // why the transfer was stopped: more bytes than the caps allow
  bool error_cut = false;     // an error body longer than kMaxErrorBytes, cut there
  std::string code, message;  // S3's error, when the request failed
  int attempts = 0;
};

}  // namespace s3_detail

using s3_detail::Request;
using s3_detail::Response;

namespace {

// The most entries a listing holds (list, list_parts, list_multipart_uploads).
constexpr size_t kMaxListEntries = 1'000'000;

// The limit on one try of a request whose answer may take minutes (slow_answer).
constexpr long kSlowAnswerMs = 15 * 60 * 1000;

constexpr const char* kEmptySha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Sets `*value` from the environment variable `name` when it is set: a number >= `min`.
void env_limit(const char* name, long min, long* value) {
  const std::string v = env(name);
  if (v.empty()) return;
  long n = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc{} || end != v.data() + v.size() || n < min) {
    throw_error(ErrorCode::kInvalidArgument,
                std::string(name) + "='" + v + "' is not a whole number >= " + std::to_string(min));
  }
  *value = n;
}

// The CA bundle of this machine's distribution: the first of the usual places that exists
// (Debian and Ubuntu, Fedora and RHEL, openSUSE, Alpine); empty when none does.
std::string system_ca_bundle() {
  for (const char* path : {"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                           "/etc/ssl/ca-bundle.pem", "/etc/ssl/cert.pem"}) {
    if (::access(path, R_OK) == 0) return path;
  }
  return "";
}

// MD5 (Content-MD5, ETags) or SHA-256 (x-amz-content-sha256) of a buffer, in hex and, when
// `base64` is given, in base64 there too.
std::string digest(const EVP_MD* md, const void* data, size_t n, std::string* base64 = nullptr) {
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data, n, d, &len, md, nullptr) != 1) {
    throw_error(ErrorCode::kInternal, "OpenSSL could not compute a digest");
  }
  if (base64 != nullptr) {
    unsigned char b64[4 * ((EVP_MAX_MD_SIZE + 2) / 3) + 1];
    const int m = EVP_EncodeBlock(b64, d, static_cast<int>(len));
    base64->assign(reinterpret_cast<char*>(b64), static_cast<size_t>(m));
  }
  return detail::hex_bytes(d, len);
}

// SigV4's UriEncode: every byte but A-Z a-z 0-9 - _ . ~ (and '/' in paths) as %XX.
std::string uri_encode(std::string_view s, bool keep_slash) {
  std::string r;
  r.reserve(s.size());
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      r += static_cast<char>(c);
    } else {
      static const char* digits = "0123456789ABCDEF";
      r += '%';
      r += digits[c >> 4];
      r += digits[c & 15];
    }
  }
  return r;
}

// A query string in SigV4's canonical form, which curl signs as given: sorted by name, each
// name and value encoded, "name=" for a flag.
std::string canonical_query(const std::map<std::string, std::string>& params) {
  std::string q;
  for (const auto& [name, value] : params) {
    if (!q.empty()) q += '&';
    q += uri_encode(name, false) + "=" + uri_encode(value, false);
  }
  return q;
}

std::string s3_name(const std::string& bucket, const std::string& key) {
  return "s3://" + bucket + (key.empty() ? "" : "/" + key);
}

// `s` with every occurrence of the secret key and the session token replaced: a server may
// echo what it was sent (the token travels in a header) into the messages we repeat.
std::string redacted(const S3Config& config, std::string s) {
  for (const std::string* secret : {&config.secret_key, &config.session_token}) {
    if (secret->size() < 4) continue;
    for (size_t at = 0; (at = s.find(*secret, at)) != std::string::npos;) {
      s.replace(at, secret->size(), "<redacted>");
    }
  }
  return s;
}

// Throws `code` with "could not <op> s3://bucket/key at <endpoint>: <why>".
[[noreturn]] void fail(const S3Config& config, const Request& q, ErrorCode code,
                       const std::string& why) {
  throw_error(code, redacted(config, "could not " + q.op + " " + s3_name(q.bucket, q.key) + " at " +
                                         config.endpoint + ": " + why));
}

// `parse()`'s result, its errors (a malformed answer) prefixed as fail() does.
template <typename Parse>
auto parsed(const S3Config& config, const Request& q, Parse parse) -> decltype(parse()) {
  try {
    return parse();
  } catch (const Error& e) {
    fail(config, q, e.code(), e.what());
  }
}

// Whether the answer's status line has come and is final (not 100 Continue).
long final_status(const Response& r) {
  long status = 0;
  curl_easy_getinfo(r.curl, CURLINFO_RESPONSE_CODE, &status);
  return status >= 200 ? status : 0;
}

// The most bytes of the body of an answer with `status` that are kept.
size_t body_cap(const Response& r, long status) {
  if (status / 100 != 2) return kMaxErrorBytes;
  return r.out != nullptr && status == 206 ? r.out_size : r.body_cap;
}

size_t on_header(char* p, size_t size, size_t n, void* user) noexcept {
  auto* r = static_cast<Response*>(user);
  const std::string_view line(p, size * n);
  try {
    if (line.rfind("HTTP/", 0) == 0) {  // a new response (after 100 Continue)
      r->etag.clear();
      r->crc32c.clear();
      r->content_length = -1;
    } else if (line.size() > 5 && strncasecmp(line.data(), "etag:", 5) == 0) {
      std::string v(line.substr(5));
      v.erase(0, v.find_first_not_of(" \t"));
      r->etag = s3_xml::unquote_etag(std::move(v));
    } else if (line.size() > 22 && strncasecmp(line.data(), "x-amz-checksum-crc32c:", 22) == 0) {
      std::string_view v = line.substr(22);
      while (!v.empty() && std::isspace(static_cast<unsigned char>(v.front()))) v.remove_prefix(1);
      while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.remove_suffix(1);
      r->crc32c = std::string(v);
    } else if (line.size() > 15 && strncasecmp(line.data(), "content-length:", 15) == 0) {
      std::string_view v = line.substr(15);
      while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
      uint64_t len = 0;
      if (std::from_chars(v.data(), v.data() + v.size(), len).ec == std::errc{}) {
        r->content_length = static_cast<int64_t>(std::min<uint64_t>(len, INT64_MAX));
      }
    } else if ((line == "\r\n" || line == "\n") && !r->no_body) {
      // The end of a response's headers: a body announced larger than its cap is refused
      // before any of it is read.
      const long status = final_status(*r);
      if (r->out != nullptr && status / 100 == 2 && status != 206) {
        r->refused = "the server ignored the Range and sent the whole object";
        return 0;
      }
      if (status != 0 && status / 100 == 2 && r->content_length >= 0 &&
          static_cast<uint64_t>(r->content_length) > body_cap(*r, status)) {
        r->refused = "the answer's Content-Length, " + std::to_string(r->content_length) +
                     ", is more than the " + std::to_string(body_cap(*r, status)) +
                     " bytes asked for";
        return 0;
      }
    }
  } catch (...) {
    return 0;
  }
  return size * n;
}

// The body goes to Response::out when the request gave one and the answer is 206 Partial
// Content, else into Response::body (errors, XML, whole objects), each within its cap.
size_t on_body(char* p, size_t size, size_t n, void* user) noexcept {
  auto* r = static_cast<Response*>(user);
  const size_t len = size * n;
  const long status = final_status(*r);
  try {
    if (r->out != nullptr && status == 206) {
      if (len > r->out_size - r->out_written) {
        r->refused = "the server sent more than the " + std::to_string(r->out_size) +
                     " bytes of the range asked for";
        return 0;
      }
      std::memcpy(static_cast<char*>(r->out) + r->out_written, p, len);
      r->out_written += len;
      return len;
    }
    if (r->out != nullptr && status / 100 == 2) {
      r->refused = "the server ignored the Range and sent the whole object";
      return 0;
    }
    const size_t cap = body_cap(*r, status);
    if (len > cap - std::min(cap, r->body.size())) {
      if (status / 100 != 2) {  // the status says enough: keep what fits, read no more
        r->body.append(p, cap - r->body.size());
        r->error_cut = true;
        return 0;
      }
      r->refused =
          "the server sent more than the " + std::to_string(cap) +
          (r->body_cap == kMaxXmlBytes ? " bytes an answer may have" : " bytes the object has");
      return 0;
    }
    r->body.append(p, len);
  } catch (...) {
    return 0;
  }
  return len;
}

bool transient_transport(CURLcode c) {
  switch (c) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

bool transient_status(const Response& r) {
  return r.status == 408 || r.status == 429 || r.status == 500 || r.status == 502 ||
         r.status == 503 || r.status == 504 || r.code == "SlowDown" ||
         r.code == "ConditionalRequestConflict" ||  // a concurrent conditional write: try again
         (r.status == 200 && !r.code.empty());      // an error inside a 200 (InternalError)
}

// The pause before try `attempt` + 1: 100 ms doubling per try, at most 5 s, with jitter.
std::chrono::milliseconds backoff(int attempt) {
  thread_local std::minstd_rand rng{std::random_device{}()};
  const double base = std::min(5000.0, 100.0 * static_cast<double>(1u << std::min(attempt, 16)));
  std::uniform_real_distribution<double> jitter(0.5, 1.0);
  return std::chrono::milliseconds(static_cast<int64_t>(base * jitter(rng)));
}

// Why S3 refused the credentials with `code` (empty: a 403 without a body), or nullptr when the
// code is not about credentials.
const char* credentials_problem(const std::string& code) {
  static const std::pair<const char*, const char*> kProblems[] = {
      {"ExpiredToken",
       "the session token (AWS_SESSION_TOKEN) has expired: renew the temporary "
       "credentials"},
      {"InvalidToken", "the session token (AWS_SESSION_TOKEN) is malformed or not valid"},
      {"TokenRefreshRequired",
       "the session token (AWS_SESSION_TOKEN) must be refreshed: renew the temporary credentials"},
      {"InvalidAccessKeyId", "the access key (AWS_ACCESS_KEY_ID) is unknown"},
      {"SignatureDoesNotMatch",
       "the signature does not match (AWS_SECRET_ACCESS_KEY, or AWS_REGION)"},
      {"InvalidSecurity", "the security token is not valid"},
      {"AccessDenied", "access denied"},
      {"", "access denied"}};
  for (const auto& [c, problem] : kProblems) {
    if (code == c) return problem;
  }
  return nullptr;
}

[[noreturn]] void fail_status(const S3Config& config, const Request& q, const Response& r) {
  std::string why = "HTTP " + std::to_string(r.status);
  if (!r.code.empty()) why += " " + r.code;
  if (!r.message.empty()) why += ": " + r.message;
  if (r.error_cut)
    why += " (the error body was cut at " + std::to_string(kMaxErrorBytes) + " bytes)";
  if (r.status == 404 || r.code == "NoSuchKey" || r.code == "NoSuchBucket" ||
      r.code == "NoSuchUpload") {
    fail(config, q, ErrorCode::kNotFound, why);
  }
  // Expired or malformed session tokens come as 400, the others as 403; a HEAD has no body
  // to carry S3's code.
  const char* problem = r.status == 400 || r.status == 403 ? credentials_problem(r.code) : nullptr;
  if (problem != nullptr && (r.status == 403 || !r.code.empty())) {
    why += " (the S3 endpoint refused the credentials: " + std::string(problem) +
           "; check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN and the bucket's "
           "permissions)";
  }
  if (r.code == "BucketAlreadyExists") fail(config, q, ErrorCode::kAlreadyExists, why);
  fail(config, q, ErrorCode::kIo, why);
}

// Throws unless the request succeeded (2xx).
void check(const S3Config& config, const Request& q, const Response& r) {
  if (r.status / 100 != 2 || !r.code.empty()) fail_status(config, q, r);
}

std::once_flag curl_init_once;

}  // namespace

// ---- S3Config, S3Url ----------------------------------------------------------------------

S3Config S3Config::from_environment() {
  S3Config c;
  c.region = env("AWS_REGION");
  if (c.region.empty()) c.region = env("AWS_DEFAULT_REGION");
  if (c.region.empty()) c.region = "us-east-1";
  c.endpoint = env("AWS_ENDPOINT_URL_S3");
  if (c.endpoint.empty()) c.endpoint = env("AWS_ENDPOINT_URL");
  const bool custom = !c.endpoint.empty();
  if (!custom) c.endpoint = "https://s3." + c.region + ".amazonaws.com";
  c.access_key = env("AWS_ACCESS_KEY_ID");
  c.secret_key = env("AWS_SECRET_ACCESS_KEY");
  c.session_token = env("AWS_SESSION_TOKEN");
  const std::string path_style = env("TSNAP_S3_PATH_STYLE");
  c.path_style = path_style.empty() ? custom : (path_style != "0" && path_style != "false");
  const std::string verify = env("TSNAP_S3_VERIFY_ETAG");
  c.verify_etag = verify != "0" && verify != "false";
  const std::string checksum = env("TSNAP_S3_CHECKSUM");
  if (checksum == "md5" || checksum == "MD5") {
    c.checksum = S3Checksum::kMd5;
  } else if (!checksum.empty() && checksum != "crc32c" && checksum != "CRC32C") {
    throw_error(ErrorCode::kInvalidArgument,
                "TSNAP_S3_CHECKSUM is '" + checksum + "'; it must be crc32c or md5");
  }
  env_limit("TSNAP_S3_CONNECT_TIMEOUT_MS", 1, &c.connect_timeout_ms);
  env_limit("TSNAP_S3_TIMEOUT_MS", 1, &c.timeout_ms);
  env_limit("TSNAP_S3_MIN_SPEED", 1, &c.min_speed);
  long attempts = c.attempts;
  env_limit("TSNAP_S3_ATTEMPTS", 1, &attempts);
  c.attempts = static_cast<int>(std::min(attempts, 100L));
  env_limit("TSNAP_S3_RETRY_MS", 0, &c.retry_ms);
  c.ca_bundle = env("AWS_CA_BUNDLE");
  if (c.ca_bundle.empty()) c.ca_bundle = env("SSL_CERT_FILE");
  if (c.ca_bundle.empty()) c.ca_bundle = system_ca_bundle();
  return c;
}

bool S3Url::is_s3(std::string_view url) { return url.rfind("s3://", 0) == 0; }

S3Url S3Url::parse(std::string_view url) {
  const auto bad = [&](const std::string& why) {
    throw_error(ErrorCode::kInvalidArgument,
                "'" + std::string(url) + "' is not an s3://bucket/prefix URL: " + why);
  };
  if (!is_s3(url)) bad("it does not start with s3://");
  std::string_view rest = url.substr(5);
  while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  const size_t slash = rest.find('/');
  S3Url u;
  u.bucket = std::string(rest.substr(0, slash));
  if (slash != std::string_view::npos) u.prefix = std::string(rest.substr(slash + 1));
  const std::string& b = u.bucket;
  const bool charset = std::all_of(b.begin(), b.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-';
  });
  if (b.size() < 3 || b.size() > 63 || !charset ||
      !std::isalnum(static_cast<unsigned char>(b[0])) ||
      !std::isalnum(static_cast<unsigned char>(b.back())) || b.find("..") != std::string::npos) {
    bad("bad bucket name '" + b + "' (3-63 of a-z 0-9 . -)");
  }
  size_t start = 0;
  while (slash != std::string_view::npos && start <= u.prefix.size()) {
    const size_t end = std::min(u.prefix.find('/', start), u.prefix.size());
    const std::string seg = u.prefix.substr(start, end - start);
    if (seg.empty() || seg == "." || seg == "..") bad("empty, '.' or '..' path segment");
    start = end + 1;
  }
  return u;
}

std::string S3Url::key(std::string_view rel) const {
  return prefix.empty() ? std::string(rel) : prefix + "/" + std::string(rel);
}

std::string S3Url::str() const { return s3_name(bucket, prefix); }

// ---- the client ---------------------------------------------------------------------------

// Idle curl handles; each keeps its connections alive for the next request.
// A child made by fork() inherits the idle handles, whose connections are the parent's sockets:
// used by both processes, each would read answers meant for the other. The first call in the
// child drops them unused (a clean-up could send a TLS close_notify on the parent's
// connection), so the child opens its own.
struct S3Client::Pool {
  std::mutex mu;
  std::vector<CURL*> idle;
  pid_t owner = ::getpid();  // the process the idle handles belong to
  ~Pool() {
    if (owner != ::getpid()) return;
    for (CURL* h : idle) curl_easy_cleanup(h);
  }
  CURL* acquire() {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (owner != ::getpid()) {
        idle.clear();  // the parent's, left alone (a few handles per fork)
        owner = ::getpid();
      }
      if (!idle.empty()) {
        CURL* h = idle.back();
        idle.pop_back();
        return h;
      }
    }
    CURL* h = curl_easy_init();
    if (!h) throw_error(ErrorCode::kIo, "curl_easy_init failed (out of memory?)");
    return h;
  }
  void release(CURL* h) {
    curl_easy_reset(h);  // drops the pointers into the finished request; keeps connections
    std::lock_guard<std::mutex> lock(mu);
    if (owner == ::getpid()) idle.push_back(h);
  }
};

S3Client::S3Client(S3Config config) : config_(std::move(config)), pool_(std::make_unique<Pool>()) {
  std::call_once(curl_init_once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  while (!config_.endpoint.empty() && config_.endpoint.back() == '/') config_.endpoint.pop_back();
  const bool http =
      config_.endpoint.rfind("http://", 0) == 0 || config_.endpoint.rfind("https://", 0) == 0;
  if (!http || config_.endpoint.find('/', config_.endpoint.find("//") + 2) != std::string::npos) {
    throw_error(ErrorCode::kInvalidArgument,
                "S3 endpoint '" + config_.endpoint + "' is not http(s)://host[:port]");
  }
  if (config_.attempts < 1 || config_.connect_timeout_ms < 1 || config_.timeout_ms < 1 ||
      config_.min_speed < 1 || config_.retry_ms < 0) {
    throw_error(ErrorCode::kInvalidArgument,
                "S3Config: attempts, connect_timeout_ms, timeout_ms and min_speed must be >= 1 "
                "and retry_ms >= 0");
  }
}

S3Client::~S3Client() = default;

Response S3Client::perform(const Request& q) {
  // The URL: path-style endpoint/bucket/key, or bucket.host/key (path-style also for bucket
  // names with dots, which TLS certificates of virtual hosts do not cover).
  std::string url;
  const std::string path = uri_encode(q.key, true);
  if (config_.path_style || q.bucket.find('.') != std::string::npos) {
    url = config_.endpoint + "/" + q.bucket + (path.empty() ? "" : "/" + path);
  } else {
    const size_t host = config_.endpoint.find("//") + 2;
    url = config_.endpoint.substr(0, host) + q.bucket + "." + config_.endpoint.substr(host) + "/" +
          path;
  }
  if (!q.query.empty()) url += "?" + q.query;

  // Signed headers: curl 7.88 signs every header given here and takes the payload hash from
  // x-amz-content-sha256 when present (without it, the hash of an empty body, and S3 refuses
  // requests without the header).
  std::vector<std::string> headers = q.headers;
  if (q.data_body) {
    headers.push_back("x-amz-content-sha256: UNSIGNED-PAYLOAD");
    if (!q.crc32c.empty()) {
      headers.push_back("x-amz-sdk-checksum-algorithm: CRC32C");
      headers.push_back("x-amz-checksum-crc32c: " + q.crc32c);
    } else {
      headers.push_back("content-md5: " + q.md5_base64);
    }
  } else if (q.body_size > 0) {
    headers.push_back("x-amz-content-sha256: " + digest(EVP_sha256(), q.body, q.body_size));
    std::string md5;
    (void)digest(EVP_md5(), q.body, q.body_size, &md5);
    headers.push_back("content-md5: " + md5);
  } else {
    headers.push_back(std::string("x-amz-content-sha256: ") + kEmptySha256);
  }
  const bool has_body = std::strcmp(q.method, "PUT") == 0 || std::strcmp(q.method, "POST") == 0;
  if (has_body) headers.push_back(std::string("content-type: ") + q.content_type);
  if (!config_.session_token.empty()) {
    headers.push_back("x-amz-security-token: " + config_.session_token);
  }
  struct Slist {
    curl_slist* p = nullptr;
    ~Slist() { curl_slist_free_all(p); }
  } slist;
  for (const std::string& h : headers) {
    curl_slist* next = curl_slist_append(slist.p, h.c_str());
    if (!next) throw_error(ErrorCode::kIo, "out of memory building an S3 request");
    slist.p = next;
  }
  const std::string sigv4 = "aws:amz:" + config_.region + ":s3";
  // A slow answer is given a minute between S3's keep-alive spaces, a byte a second being enough.
  const long stall_s = std::max(q.slow_answer ? 60L : 1L, (config_.timeout_ms + 999) / 1000);
  const long min_speed = q.slow_answer ? 1L : config_.min_speed;

  struct Lease {
    Pool& pool;
    CURL* h;
    ~Lease() { pool.release(h); }
  } lease{*pool_, pool_->acquire()};
  CURL* h = lease.h;

  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  // Whether try `attempt` failed in a way worth another try, and there is time for it; if so,
  // waits before it.
  const auto retry = [&](int attempt) {
    if (attempt >= config_.attempts) return false;
    const std::chrono::milliseconds pause = backoff(attempt);
    if (config_.retry_ms > 0 &&
        Clock::now() + pause - start >= std::chrono::milliseconds(config_.retry_ms)) {
      return false;
    }
    std::this_thread::sleep_for(pause);
    return true;
  };
  const auto tries = [&](int attempt) {
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    char took[32];
    std::snprintf(took, sizeof took, "%.1f", s);
    return " (" + std::to_string(attempt) + (attempt == 1 ? " attempt in " : " attempts in ") +
           took + " s)";
  };

  Response r;
  for (int attempt = 1;; ++attempt) {
    r = Response{};
    r.curl = h;
    r.no_body = std::strcmp(q.method, "HEAD") == 0;
    r.out = q.out;
    r.out_size = q.out_size;
    r.body_cap = q.body_cap;
    r.attempts = attempt;
    char errbuf[CURL_ERROR_SIZE] = "";
    curl_easy_reset(h);  // keeps the connection cache
    curl_easy_setopt(h, CURLOPT_URL, url.c_str());
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);  // a key's "." or ".." segments are data
    curl_easy_setopt(h, CURLOPT_USERAGENT, "tsnap");
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, config_.connect_timeout_ms);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, min_speed);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, stall_s);
    if (q.slow_answer) curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, kSlowAnswerMs);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    if (!config_.ca_bundle.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, config_.ca_bundle.c_str());
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, slist.p);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &r);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &r);
    if (!config_.access_key.empty()) {
      curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sigv4.c_str());
      curl_easy_setopt(h, CURLOPT_USERNAME, config_.access_key.c_str());
      curl_easy_setopt(h, CURLOPT_PASSWORD, config_.secret_key.c_str());
    }
    if (std::strcmp(q.method, "HEAD") == 0) {
      curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (has_body) {
      // POSTFIELDS sends the caller's memory as it is (no copy), under the method given.
      curl_easy_setopt(h, CURLOPT_POSTFIELDS, q.body != nullptr ? q.body : "");
      curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(q.body_size));
      curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, q.method);
    } else if (std::strcmp(q.method, "GET") != 0) {
      curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, q.method);
    }

    const CURLcode rc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.status);
    r.curl = nullptr;
    if (!r.refused.empty()) fail(config_, q, ErrorCode::kIo, r.refused + tries(attempt));
    if (rc != CURLE_OK && !(rc == CURLE_WRITE_ERROR && r.error_cut)) {
      if (transient_transport(rc) && retry(attempt)) continue;
      const std::string why = errbuf[0] ? errbuf : curl_easy_strerror(rc);
      const bool unreachable = rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_COULDNT_CONNECT ||
                               rc == CURLE_SSL_CONNECT_ERROR;
      const bool silent = rc == CURLE_OPERATION_TIMEDOUT && r.status == 0;
      fail(config_, q, ErrorCode::kIo,
           (unreachable ? "could not reach the S3 endpoint: "
            : silent    ? "the S3 endpoint did not answer: "
                        : "the connection to the S3 endpoint failed: ") +
               why + tries(attempt));
    }
    const bool xml_error =
        r.status / 100 != 2 || (q.error_in_200 && s3_xml::root(r.body) == "Error");
    if (xml_error) {
      s3_xml::ErrorBody e = s3_xml::parse_error(r.body);
      r.code = std::move(e.code);
      r.message = std::move(e.message);
      if (r.status / 100 == 2 && r.code.empty()) r.code = "InternalError";
    }
    if (transient_status(r) && retry(attempt)) continue;
    return r;
  }
}

// ---- operations ---------------------------------------------------------------------------

namespace {

// Whether the server received the bytes sent: the CRC-32C it gives back (if it does) is theirs,
// or (with S3Checksum::kMd5) the ETag is their MD5.
void check_received(const S3Config& config, const Request& q, const Response& r) {
  if (!q.crc32c.empty()) {
    if (!r.crc32c.empty() && r.crc32c != q.crc32c) {
      fail(config, q, ErrorCode::kHashMismatch,
           "the CRC-32C the server computed, '" + r.crc32c +
               "', is not the one of the bytes sent (" + q.crc32c + ")");
    }
    return;
  }
  if (!config.verify_etag) return;
  std::string etag = r.etag;
  std::transform(etag.begin(), etag.end(), etag.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const std::string& md5 = q.md5_hex;
  if (etag != md5) {
    fail(config, q, ErrorCode::kHashMismatch,
         "the ETag returned, '" + r.etag + "', is not the MD5 of the bytes sent (" + md5 +
             "; with SSE-KMS or SSE-C set TSNAP_S3_VERIFY_ETAG=0)");
  }
}

Request data_request(const char* method, std::string op, const std::string& bucket,
                     const std::string& key, const void* data, size_t n, S3Checksum checksum) {
  Request q(method, std::move(op), bucket, key);
  q.body = data;
  q.body_size = n;
  q.data_body = true;
  q.content_type = "application/octet-stream";
  if (checksum == S3Checksum::kCrc32c) {
    q.crc32c = crc32c_base64(crc32c(data, n));
  } else {
    q.md5_hex = digest(EVP_md5(), data, n, &q.md5_base64);
  }
  return q;
}

// A request whose body is the XML document `xml` (borrowed).
Request xml_request(const char* method, std::string op, const std::string& bucket,
                    const std::string& key, std::string query, const std::string& xml) {
  Request q(method, std::move(op), bucket, key, std::move(query));
  q.body = xml.data();
  q.body_size = xml.size();
  return q;
}

// The marker of the page after the one `q` asked for with `marker` ("" after the last page).
// A server that gives the same marker again, or more than kMaxListEntries entries in all, is
// refused: a listing ends, and memory stays bounded.
std::string next_page(const S3Config& config, const Request& q, const std::string& marker,
                      std::string next, size_t entries) {
  if (!next.empty() && next == marker) {
    fail(config, q, ErrorCode::kIo, "the server gave the same page marker twice");
  }
  if (entries > kMaxListEntries) {
    fail(config, q, ErrorCode::kIo,
         "more than " + std::to_string(kMaxListEntries) + " entries; refusing to list further");
  }
  return next;
}

}  // namespace

void S3Client::put_object(const std::string& bucket, const std::string& key, const void* data,
                          size_t n, bool if_absent) {
  Request q = data_request("PUT", "PUT", bucket, key, data, n, config_.checksum);
  if (if_absent) q.headers.push_back("if-none-match: *");
  const Response r = perform(q);
  if (if_absent && (r.status == 412 || r.code == "PreconditionFailed")) {
    fail(config_, q, ErrorCode::kAlreadyExists,
         "the object exists (HTTP 412 PreconditionFailed to If-None-Match: *)");
  }
  check(config_, q, r);
  check_received(config_, q, r);
}

std::string S3Client::create_multipart_upload(const std::string& bucket, const std::string& key) {
  Request q("POST", "start a multipart upload of", bucket, key, canonical_query({{"uploads", ""}}));
  q.content_type = "application/octet-stream";  // S3 keeps it as the object's
  if (config_.checksum == S3Checksum::kCrc32c) {
    q.headers.push_back("x-amz-checksum-algorithm: CRC32C");
  }
  const Response r = perform(q);
  check(config_, q, r);
  return parsed(config_, q, [&] { return s3_xml::parse_upload_id(r.body); });
}

S3Part S3Client::upload_part(const std::string& bucket, const std::string& key,
                             const std::string& upload_id, int part_number, const void* data,
                             size_t n) {
  if (part_number < 1 || part_number > 10000) {
    throw_error(ErrorCode::kInvalidArgument,
                "S3 part number " + std::to_string(part_number) + " is not in 1..10000");
  }
  Request q = data_request("PUT", "upload part " + std::to_string(part_number) + " of", bucket, key,
                           data, n, config_.checksum);
  q.query = canonical_query({{"partNumber", std::to_string(part_number)}, {"uploadId", upload_id}});
  const Response r = perform(q);
  check(config_, q, r);
  check_received(config_, q, r);
  return S3Part{part_number, n, r.etag, q.crc32c};
}

void S3Client::complete_multipart_upload(const std::string& bucket, const std::string& key,
                                         const std::string& upload_id,
                                         const std::vector<S3Part>& parts) {
  std::string xml = "<CompleteMultipartUpload>";
  for (const S3Part& p : parts) {
    xml += "<Part><PartNumber>" + std::to_string(p.number) + "</PartNumber><ETag>\"" +
           s3_xml::escape(p.etag) + "\"</ETag>";
    if (!p.crc32c.empty())
      xml += "<ChecksumCRC32C>" + s3_xml::escape(p.crc32c) + "</ChecksumCRC32C>";
    xml += "</Part>";
  }
  xml += "</CompleteMultipartUpload>";
  Request q = xml_request("POST", "complete the multipart upload of", bucket, key,
                          canonical_query({{"uploadId", upload_id}}), xml);
  q.error_in_200 = true;
  q.slow_answer = true;
  const Response r = perform(q);
  if (r.attempts > 1 && r.code == "NoSuchUpload") {
    // A retry after a lost answer: the first try may have completed the upload. The object
    // of a completed n-part upload has an ETag ending in "-n".
    const auto head = head_object(bucket, key);
    const std::string suffix = "-" + std::to_string(parts.size());
    if (head && head->etag.size() > suffix.size() &&
        head->etag.compare(head->etag.size() - suffix.size(), suffix.size(), suffix) == 0) {
      return;
    }
  }
  check(config_, q, r);
}

void S3Client::abort_multipart_upload(const std::string& bucket, const std::string& key,
                                      const std::string& upload_id) {
  const Request q("DELETE", "abort the multipart upload of", bucket, key,
                  canonical_query({{"uploadId", upload_id}}));
  check(config_, q, perform(q));
}

std::vector<S3Part> S3Client::list_parts(const std::string& bucket, const std::string& key,
                                         const std::string& upload_id, int page_size) {
  std::vector<S3Part> parts;
  std::string marker;
  do {
    std::map<std::string, std::string> params{{"max-parts", std::to_string(page_size)},
                                              {"uploadId", upload_id}};
    if (!marker.empty()) params["part-number-marker"] = marker;
    const Request q("GET", "list the parts of", bucket, key, canonical_query(params));
    const Response r = perform(q);
    check(config_, q, r);
    s3_xml::PartPage page = parsed(config_, q, [&] { return s3_xml::parse_part_page(r.body); });
    parts.insert(parts.end(), page.parts.begin(), page.parts.end());
    marker = next_page(config_, q, marker, std::move(page.next_marker), parts.size());
  } while (!marker.empty());
  return parts;
}

std::vector<S3Upload> S3Client::list_multipart_uploads(const std::string& bucket,
                                                       const std::string& prefix, int page_size) {
  std::vector<S3Upload> uploads;
  std::string key_marker, id_marker;
  do {
    std::map<std::string, std::string> params{
        {"max-uploads", std::to_string(page_size)}, {"prefix", prefix}, {"uploads", ""}};
    if (!key_marker.empty()) params["key-marker"] = key_marker;
    if (!id_marker.empty()) params["upload-id-marker"] = id_marker;
    const Request q("GET", "list the multipart uploads of", bucket, "", canonical_query(params));
    const Response r = perform(q);
    check(config_, q, r);
    s3_xml::UploadPage page = parsed(config_, q, [&] { return s3_xml::parse_upload_page(r.body); });
    uploads.insert(uploads.end(), page.uploads.begin(), page.uploads.end());
    // Both markers together say where the next page starts.
    const std::string next =
        page.next_key.empty() ? "" : page.next_key + '\n' + page.next_upload_id;
    next_page(config_, q, key_marker + '\n' + id_marker, next, uploads.size());
    key_marker = std::move(page.next_key);
    id_marker = std::move(page.next_upload_id);
  } while (!key_marker.empty());
  return uploads;
}

void S3Client::get_range(const std::string& bucket, const std::string& key, uint64_t offset,
                         void* out, size_t n) {
  if (n == 0) return;
  const uint64_t last = offset + n - 1;
  Request q("GET", "GET bytes " + std::to_string(offset) + "-" + std::to_string(last) + " of",
            bucket, key);
  q.headers.push_back("range: bytes=" + std::to_string(offset) + "-" + std::to_string(last));
  q.out = out;
  q.out_size = n;
  const Response r = perform(q);
  if (r.status == 416) {
    throw_error(ErrorCode::kTruncated, s3_name(bucket, key) + " ends before byte offset " +
                                           std::to_string(offset) + " (" + std::to_string(n) +
                                           " bytes asked for)");
  }
  check(config_, q, r);
  if (r.out_written != n) {
    throw_error(ErrorCode::kTruncated,
                s3_name(bucket, key) + " is truncated: " + std::to_string(r.out_written) + " of " +
                    std::to_string(n) + " bytes at offset " + std::to_string(offset));
  }
}

std::string S3Client::get_object(const std::string& bucket, const S3Object& head) {
  Request q("GET", "GET", bucket, head.key);
  q.body_cap = static_cast<size_t>(std::min<uint64_t>(head.size, SIZE_MAX));
  if (!head.etag.empty()) q.headers.push_back("if-match: \"" + head.etag + "\"");
  Response r = perform(q);
  if (r.status == 412 || r.code == "PreconditionFailed") {
    fail(config_, q, ErrorCode::kNotFound,
         "the object changed since its HEAD (ETag " + head.etag + "; HTTP 412 to If-Match)");
  }
  check(config_, q, r);
  if (r.body.size() != head.size) {
    throw_error(ErrorCode::kTruncated, s3_name(bucket, head.key) +
                                           " is truncated: " + std::to_string(r.body.size()) +
                                           " of " + std::to_string(head.size) + " bytes");
  }
  return std::move(r.body);
}

std::optional<S3Object> S3Client::head_object(const std::string& bucket, const std::string& key) {
  const Request q("HEAD", "HEAD", bucket, key);
  const Response r = perform(q);
  if (r.status == 404) return std::nullopt;
  check(config_, q, r);
  if (r.content_length < 0) fail(config_, q, ErrorCode::kIo, "no Content-Length in the answer");
  return S3Object{key, static_cast<uint64_t>(r.content_length), r.etag};
}

S3Listing S3Client::list(const std::string& bucket, const std::string& prefix,
                         const std::string& delimiter, int page_size) {
  S3Listing listing;
  std::string token;
  do {
    std::map<std::string, std::string> params{
        {"list-type", "2"}, {"max-keys", std::to_string(page_size)}, {"prefix", prefix}};
    if (!delimiter.empty()) params["delimiter"] = delimiter;
    if (!token.empty()) params["continuation-token"] = token;
    const Request q("GET", "list", bucket, "", canonical_query(params));
    const Response r = perform(q);
    check(config_, q, r);
    s3_xml::ObjectPage page = parsed(config_, q, [&] { return s3_xml::parse_object_page(r.body); });
    for (S3Object& o : page.objects) listing.objects.push_back(std::move(o));
    for (std::string& p : page.prefixes) listing.prefixes.push_back(std::move(p));
    token = next_page(config_, q, token, std::move(page.next_token),
                      listing.objects.size() + listing.prefixes.size());
  } while (!token.empty());
  return listing;
}

void S3Client::delete_object(const std::string& bucket, const std::string& key) {
  const Request q("DELETE", "DELETE", bucket, key);
  check(config_, q, perform(q));
}

void S3Client::delete_objects(const std::string& bucket, const std::vector<std::string>& keys) {
  for (size_t begin = 0; begin < keys.size(); begin += 1000) {
    const size_t end = std::min(keys.size(), begin + 1000);
    std::string xml = "<Delete><Quiet>true</Quiet>";
    for (size_t i = begin; i < end; ++i) {
      xml += "<Object><Key>" + s3_xml::escape(keys[i]) + "</Key></Object>";
    }
    xml += "</Delete>";
    const Request q = xml_request("POST", "delete " + std::to_string(end - begin) + " objects from",
                                  bucket, "", canonical_query({{"delete", ""}}), xml);
    const Response r = perform(q);
    check(config_, q, r);
    const std::vector<s3_xml::KeyError> errors =
        parsed(config_, q, [&] { return s3_xml::parse_delete_errors(r.body); });
    if (!errors.empty()) {
      fail(config_, q, ErrorCode::kIo,
           s3_name(bucket, errors[0].key) + ": " + errors[0].code + ": " + errors[0].message +
               " (" + std::to_string(errors.size()) + " of " + std::to_string(end - begin) +
               " keys failed)");
    }
  }
}

void S3Client::create_bucket(const std::string& bucket) {
  std::string xml;
  if (config_.region != "us-east-1") {
    xml = "<CreateBucketConfiguration><LocationConstraint>" + s3_xml::escape(config_.region) +
          "</LocationConstraint></CreateBucketConfiguration>";
  }
  const Request q = xml_request("PUT", "create the bucket", bucket, "", "", xml);
  const Response r = perform(q);
  if (r.code == "BucketAlreadyOwnedByYou") return;
  check(config_, q, r);
}

std::string md5_hex(const void* data, size_t n) { return digest(EVP_md5(), data, n); }

}  // namespace tsnap::io
