#include "io/s3_client.h"

#include <curl/curl.h>
#include <openssl/evp.h>

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
  bool data_body = false;            // object data: UNSIGNED-PAYLOAD and Content-MD5 (else hashed)
  std::vector<std::string> headers;  // extra, "lower-case-name: value" (all signed)
  void* out = nullptr;               // ranged GET: the 206 body goes here...
  size_t out_size = 0;               // ...at most this many bytes
  bool error_in_200 = false;         // a 200 whose body is <Error> failed (CompleteMultipartUpload)
  const char* content_type = "application/xml";  // of a PUT/POST body
};

struct Response {
  CURL* curl = nullptr;  // during the transfer only
  long status = 0;
  std::string body;  // the body, unless it went to Request::out
  std::string etag;  // without quotes
  int64_t content_length = -1;
  void* out = nullptr;  // Request::out, Request::out_size
  size_t out_size = 0;
  size_t out_written = 0;
  bool out_overflow = false;  // more bytes than Request::out_size, or a 200 to a ranged GET
  std::string code, message;  // S3's error, when the request failed
  int attempts = 0;
};

}  // namespace s3_detail

using s3_detail::Request;
using s3_detail::Response;

namespace {

constexpr const char* kEmptySha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// MD5 (Content-MD5, ETags) or SHA-256 (x-amz-content-sha256) of a buffer.
std::string digest(const EVP_MD* md, const void* data, size_t n, bool base64) {
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data, n, d, &len, md, nullptr) != 1) {
    throw_error(ErrorCode::kInternal, "OpenSSL could not compute a digest");
  }
  if (!base64) return detail::hex_bytes(d, len);
  unsigned char b64[4 * ((EVP_MAX_MD_SIZE + 2) / 3) + 1];
  const int m = EVP_EncodeBlock(b64, d, static_cast<int>(len));
  return std::string(reinterpret_cast<char*>(b64), static_cast<size_t>(m));
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

// Text for an XML element: & < > escaped.
std::string xml_escape(std::string_view s) {
  std::string r;
  for (const char& c : s) {
    const char* e = c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : nullptr;
    r += e != nullptr ? std::string_view(e) : std::string_view(&c, 1);
  }
  return r;
}

// An element's text with its entities (named, &#N; and &#xN;) replaced, as UTF-8.
std::string xml_decode(std::string_view s) {
  static const std::pair<std::string_view, char> kNamed[] = {
      {"amp", '&'}, {"lt", '<'}, {"gt", '>'}, {"quot", '"'}, {"apos", '\''}};
  std::string r;
  for (size_t i = 0; i < s.size(); ++i) {
    const size_t semi = s[i] == '&' ? s.find(';', i) : std::string_view::npos;
    const std::string_view ent =
        semi == std::string_view::npos ? std::string_view() : s.substr(i + 1, semi - i - 1);
    uint32_t cp = 0;
    for (const auto& [name, c] : kNamed) {
      if (ent == name) cp = static_cast<unsigned char>(c);
    }
    if (ent.size() > 1 && ent[0] == '#') {
      const bool hx = ent[1] == 'x' || ent[1] == 'X';
      const std::string_view num = ent.substr(hx ? 2 : 1);
      const auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), cp, hx ? 16 : 10);
      if (ec != std::errc{} || end != num.data() + num.size()) cp = 0;
    }
    if (cp == 0 || cp > 0x10FFFF) {
      r += s[i];
      continue;
    }
    if (cp < 0x80) {
      r += static_cast<char>(cp);
    } else {
      const int extra = cp < 0x800 ? 1 : cp < 0x10000 ? 2 : 3;  // continuation bytes
      r += static_cast<char>(((0xFF00 >> (extra + 1)) & 0xFF) | (cp >> (6 * extra)));
      for (int k = extra - 1; k >= 0; --k) r += static_cast<char>(0x80 | ((cp >> (6 * k)) & 0x3F));
    }
    i = semi;
  }
  return r;
}

// The raw contents of each <tag ...>...</tag> (or "" for <tag/>) in `xml`, in order. S3's
// responses are flat enough for this: the elements asked for never nest in themselves.
std::vector<std::string_view> xml_elements(std::string_view xml, std::string_view tag) {
  std::vector<std::string_view> found;
  const std::string open = "<" + std::string(tag);
  const std::string close = "</" + std::string(tag) + ">";
  size_t pos = 0;
  while ((pos = xml.find(open, pos)) != std::string_view::npos) {
    const size_t after = pos + open.size();
    if (after >= xml.size()) break;
    const char c = xml[after];
    if (c != '>' && c != '/' && !std::isspace(static_cast<unsigned char>(c))) {
      pos = after;  // a longer name: <KeyMarker> is not <Key>
      continue;
    }
    const size_t gt = xml.find('>', after);
    if (gt == std::string_view::npos) break;
    if (xml[gt - 1] == '/') {
      found.emplace_back();
      pos = gt + 1;
      continue;
    }
    const size_t end = xml.find(close, gt + 1);
    if (end == std::string_view::npos) break;
    found.push_back(xml.substr(gt + 1, end - gt - 1));
    pos = end + close.size();
  }
  return found;
}

// The decoded text of the first <tag> in `xml`, "" when there is none.
std::string xml_text(std::string_view xml, std::string_view tag) {
  const auto all = xml_elements(xml, tag);
  return all.empty() ? std::string() : xml_decode(all.front());
}

// The root element's name of an XML document.
std::string_view xml_root(std::string_view xml) {
  size_t pos = 0;
  while ((pos = xml.find('<', pos)) != std::string_view::npos) {
    if (pos + 1 < xml.size() && xml[pos + 1] != '?' && xml[pos + 1] != '!') {
      const size_t end = xml.find_first_of(" \t\r\n/>", pos + 1);
      return xml.substr(pos + 1, end == std::string_view::npos ? end : end - pos - 1);
    }
    ++pos;
  }
  return {};
}

std::string s3_name(const std::string& bucket, const std::string& key) {
  return "s3://" + bucket + (key.empty() ? "" : "/" + key);
}

uint64_t parse_u64(std::string_view s, const Request& q) {
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end != s.data() + s.size()) {
    throw_error(ErrorCode::kIo, "could not " + q.op + " " + s3_name(q.bucket, q.key) +
                                    ": malformed number '" + std::string(s) + "' in the response");
  }
  return v;
}

std::string unquote(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

size_t on_header(char* p, size_t size, size_t n, void* user) noexcept {
  auto* r = static_cast<Response*>(user);
  const std::string_view line(p, size * n);
  if (line.rfind("HTTP/", 0) == 0) {
    r->etag.clear();  // a new response (after 100 Continue)
  } else if (line.size() > 5 && strncasecmp(line.data(), "etag:", 5) == 0) {
    try {
      std::string v(line.substr(5));
      v.erase(0, v.find_first_not_of(" \t"));
      r->etag = unquote(std::move(v));
    } catch (...) {
      return 0;
    }
  }
  return size * n;
}

// The body goes to Response::out when the request gave one and the answer is 206 Partial
// Content, else into Response::body (errors, XML, whole objects).
size_t on_body(char* p, size_t size, size_t n, void* user) noexcept {
  auto* r = static_cast<Response*>(user);
  const size_t len = size * n;
  if (r->out != nullptr) {
    long status = 0;
    curl_easy_getinfo(r->curl, CURLINFO_RESPONSE_CODE, &status);
    if (status == 206) {
      if (len > r->out_size - r->out_written) {
        r->out_overflow = true;
        return 0;
      }
      std::memcpy(static_cast<char*>(r->out) + r->out_written, p, len);
      r->out_written += len;
      return len;
    }
    if (status / 100 == 2) {  // the whole object: the server ignored the Range
      r->out_overflow = true;
      return 0;
    }
  }
  try {
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
         (r.status == 200 && !r.code.empty());  // an error inside a 200 (InternalError)
}

// Sleeps before try `attempt` + 1: 100 ms doubling per try, at most 5 s, with jitter.
void backoff(int attempt) {
  thread_local std::minstd_rand rng{std::random_device{}()};
  const double base = std::min(5000.0, 100.0 * static_cast<double>(1u << std::min(attempt, 16)));
  std::uniform_real_distribution<double> jitter(0.5, 1.0);
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(base * jitter(rng)));
}

[[noreturn]] void fail_status(const Request& q, const Response& r) {
  std::string msg =
      "could not " + q.op + " " + s3_name(q.bucket, q.key) + ": HTTP " + std::to_string(r.status);
  if (!r.code.empty()) msg += " " + r.code;
  if (!r.message.empty()) msg += ": " + r.message;
  if (r.status == 404 || r.code == "NoSuchKey" || r.code == "NoSuchBucket" ||
      r.code == "NoSuchUpload") {
    throw_error(ErrorCode::kNotFound, msg);
  }
  static const char* const kCredentialCodes[] = {
      "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied",   "InvalidToken",
      "ExpiredToken",       "TokenRefreshRequired",  "InvalidSecurity"};
  const bool credentials =
      r.status == 403 &&
      (r.code.empty() || std::find(std::begin(kCredentialCodes), std::end(kCredentialCodes),
                                   r.code) != std::end(kCredentialCodes));
  if (credentials) {
    msg +=
        " (the S3 endpoint refused the credentials: check AWS_ACCESS_KEY_ID, "
        "AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN and the bucket's permissions)";
  }
  if (r.code == "BucketAlreadyExists") throw_error(ErrorCode::kAlreadyExists, msg);
  throw_error(ErrorCode::kIo, msg);
}

// Throws unless the request succeeded (2xx).
void check(const Request& q, const Response& r) {
  if (r.status / 100 != 2 || !r.code.empty()) fail_status(q, r);
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
struct S3Client::Pool {
  std::mutex mu;
  std::vector<CURL*> idle;
  ~Pool() {
    for (CURL* h : idle) curl_easy_cleanup(h);
  }
  CURL* acquire() {
    {
      std::lock_guard<std::mutex> lock(mu);
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
    idle.push_back(h);
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
  if (config_.attempts < 1) throw_error(ErrorCode::kInvalidArgument, "S3Config::attempts < 1");
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
    headers.push_back("content-md5: " + digest(EVP_md5(), q.body, q.body_size, true));
  } else if (q.body_size > 0) {
    headers.push_back("x-amz-content-sha256: " + digest(EVP_sha256(), q.body, q.body_size, false));
    headers.push_back("content-md5: " + digest(EVP_md5(), q.body, q.body_size, true));
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
  const long stall_s = std::max(1L, (config_.timeout_ms + 999) / 1000);

  struct Lease {
    Pool& pool;
    CURL* h;
    ~Lease() { pool.release(h); }
  } lease{*pool_, pool_->acquire()};
  CURL* h = lease.h;

  Response r;
  for (int attempt = 1;; ++attempt) {
    r = Response{};
    r.curl = h;
    r.out = q.out;
    r.out_size = q.out_size;
    r.attempts = attempt;
    char errbuf[CURL_ERROR_SIZE] = "";
    curl_easy_reset(h);  // keeps the connection cache
    curl_easy_setopt(h, CURLOPT_URL, url.c_str());
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);  // a key's "." or ".." segments are data
    curl_easy_setopt(h, CURLOPT_USERAGENT, "tsnap");
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, config_.connect_timeout_ms);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, stall_s);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
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
    curl_off_t length = -1;
    curl_easy_getinfo(h, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
    r.content_length = length;
    r.curl = nullptr;
    if (r.out_overflow) return r;  // the caller says what was wrong
    if (rc != CURLE_OK) {
      if (transient_transport(rc) && attempt < config_.attempts) {
        backoff(attempt);
        continue;
      }
      const std::string why = errbuf[0] ? errbuf : curl_easy_strerror(rc);
      const bool unreachable = rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_COULDNT_CONNECT ||
                               rc == CURLE_OPERATION_TIMEDOUT || rc == CURLE_SSL_CONNECT_ERROR;
      throw_error(ErrorCode::kIo, "could not " + q.op + " " + s3_name(q.bucket, q.key) + ": " +
                                      (unreachable ? "could not reach the S3 endpoint "
                                                   : "the connection to the S3 endpoint ") +
                                      config_.endpoint + (unreachable ? ": " : " failed: ") + why +
                                      " (" + std::to_string(attempt) +
                                      (attempt == 1 ? " attempt)" : " attempts)"));
    }
    const bool xml_error = r.status / 100 != 2 || (q.error_in_200 && xml_root(r.body) == "Error");
    if (xml_error) {
      r.code = xml_text(r.body, "Code");
      r.message = xml_text(r.body, "Message");
      if (r.status / 100 == 2 && r.code.empty()) r.code = "InternalError";
    }
    if (transient_status(r) && attempt < config_.attempts) {
      backoff(attempt);
      continue;
    }
    return r;
  }
}

// ---- operations ---------------------------------------------------------------------------

namespace {

// Whether `etag` is the MD5 of the bytes sent.
void check_etag(const S3Config& config, const Request& q, const Response& r) {
  if (!config.verify_etag) return;
  std::string etag = r.etag;
  std::transform(etag.begin(), etag.end(), etag.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const std::string md5 = digest(EVP_md5(), q.body, q.body_size, false);
  if (etag != md5) {
    throw_error(ErrorCode::kHashMismatch,
                "could not " + q.op + " " + s3_name(q.bucket, q.key) + ": the ETag returned, '" +
                    r.etag + "', is not the MD5 of the bytes sent (" + md5 +
                    "; with SSE-KMS or SSE-C set TSNAP_S3_VERIFY_ETAG=0)");
  }
}

Request data_request(const char* method, std::string op, const std::string& bucket,
                     const std::string& key, const void* data, size_t n) {
  Request q(method, std::move(op), bucket, key);
  q.body = data;
  q.body_size = n;
  q.data_body = true;
  q.content_type = "application/octet-stream";
  return q;
}

}  // namespace

void S3Client::put_object(const std::string& bucket, const std::string& key, const void* data,
                          size_t n) {
  const Request q = data_request("PUT", "PUT", bucket, key, data, n);
  const Response r = perform(q);
  check(q, r);
  check_etag(config_, q, r);
}

std::string S3Client::create_multipart_upload(const std::string& bucket, const std::string& key) {
  Request q("POST", "start a multipart upload of", bucket, key, canonical_query({{"uploads", ""}}));
  q.content_type = "application/octet-stream";  // S3 keeps it as the object's
  const Response r = perform(q);
  check(q, r);
  std::string id = xml_text(r.body, "UploadId");
  if (id.empty()) {
    throw_error(ErrorCode::kIo,
                "could not " + q.op + " " + s3_name(bucket, key) + ": no UploadId in the response");
  }
  return id;
}

std::string S3Client::upload_part(const std::string& bucket, const std::string& key,
                                  const std::string& upload_id, int part_number, const void* data,
                                  size_t n) {
  if (part_number < 1 || part_number > 10000) {
    throw_error(ErrorCode::kInvalidArgument,
                "S3 part number " + std::to_string(part_number) + " is not in 1..10000");
  }
  Request q = data_request("PUT", "upload part " + std::to_string(part_number) + " of", bucket, key,
                           data, n);
  q.query = canonical_query({{"partNumber", std::to_string(part_number)}, {"uploadId", upload_id}});
  const Response r = perform(q);
  check(q, r);
  check_etag(config_, q, r);
  return r.etag;
}

void S3Client::complete_multipart_upload(const std::string& bucket, const std::string& key,
                                         const std::string& upload_id,
                                         const std::vector<S3Part>& parts) {
  std::string xml = "<CompleteMultipartUpload>";
  for (const S3Part& p : parts) {
    xml += "<Part><PartNumber>" + std::to_string(p.number) + "</PartNumber><ETag>\"" +
           xml_escape(p.etag) + "\"</ETag></Part>";
  }
  xml += "</CompleteMultipartUpload>";
  Request q("POST", "complete the multipart upload of", bucket, key,
            canonical_query({{"uploadId", upload_id}}));
  q.body = xml.data();
  q.body_size = xml.size();
  q.error_in_200 = true;
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
  check(q, r);
}

void S3Client::abort_multipart_upload(const std::string& bucket, const std::string& key,
                                      const std::string& upload_id) {
  const Request q("DELETE", "abort the multipart upload of", bucket, key,
                  canonical_query({{"uploadId", upload_id}}));
  check(q, perform(q));
}

std::vector<S3Part> S3Client::list_parts(const std::string& bucket, const std::string& key,
                                         const std::string& upload_id, int page_size) {
  std::vector<S3Part> parts;
  std::string marker;
  for (;;) {
    std::map<std::string, std::string> params{{"max-parts", std::to_string(page_size)},
                                              {"uploadId", upload_id}};
    if (!marker.empty()) params["part-number-marker"] = marker;
    const Request q("GET", "list the parts of", bucket, key, canonical_query(params));
    const Response r = perform(q);
    check(q, r);
    for (std::string_view p : xml_elements(r.body, "Part")) {
      S3Part part;
      part.number = static_cast<int>(parse_u64(xml_text(p, "PartNumber"), q));
      part.size = parse_u64(xml_text(p, "Size"), q);
      part.etag = unquote(xml_text(p, "ETag"));
      parts.push_back(std::move(part));
    }
    const std::string next = xml_text(r.body, "NextPartNumberMarker");
    if (xml_text(r.body, "IsTruncated") != "true" || next.empty() || next == marker) break;
    marker = next;
  }
  return parts;
}

std::vector<S3Upload> S3Client::list_multipart_uploads(const std::string& bucket,
                                                       const std::string& prefix, int page_size) {
  std::vector<S3Upload> uploads;
  std::string key_marker, id_marker;
  for (;;) {
    std::map<std::string, std::string> params{
        {"max-uploads", std::to_string(page_size)}, {"prefix", prefix}, {"uploads", ""}};
    if (!key_marker.empty()) params["key-marker"] = key_marker;
    if (!id_marker.empty()) params["upload-id-marker"] = id_marker;
    const Request q("GET", "list the multipart uploads of", bucket, "", canonical_query(params));
    const Response r = perform(q);
    check(q, r);
    for (std::string_view u : xml_elements(r.body, "Upload")) {
      uploads.push_back({xml_text(u, "Key"), xml_text(u, "UploadId"), xml_text(u, "Initiated")});
    }
    const std::string next_key = xml_text(r.body, "NextKeyMarker");
    const std::string next_id = xml_text(r.body, "NextUploadIdMarker");
    if (xml_text(r.body, "IsTruncated") != "true" || next_key.empty() ||
        (next_key == key_marker && next_id == id_marker)) {
      break;
    }
    key_marker = next_key;
    id_marker = next_id;
  }
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
  if (r.out_overflow) {
    throw_error(ErrorCode::kIo, "could not " + q.op + " " + s3_name(bucket, key) +
                                    ": the server sent more than the range asked for");
  }
  if (r.status == 416) {
    throw_error(ErrorCode::kTruncated, s3_name(bucket, key) + " ends before byte offset " +
                                           std::to_string(offset) + " (" + std::to_string(n) +
                                           " bytes asked for)");
  }
  check(q, r);
  if (r.out_written != n) {
    throw_error(ErrorCode::kTruncated,
                s3_name(bucket, key) + " is truncated: " + std::to_string(r.out_written) + " of " +
                    std::to_string(n) + " bytes at offset " + std::to_string(offset));
  }
}

std::string S3Client::get_object(const std::string& bucket, const std::string& key) {
  const Request q("GET", "GET", bucket, key);
  Response r = perform(q);
  check(q, r);
  return std::move(r.body);
}

std::optional<S3Object> S3Client::head_object(const std::string& bucket, const std::string& key) {
  const Request q("HEAD", "HEAD", bucket, key);
  const Response r = perform(q);
  if (r.status == 404) return std::nullopt;
  check(q, r);
  if (r.content_length < 0) {
    throw_error(ErrorCode::kIo,
                "could not HEAD " + s3_name(bucket, key) + ": no Content-Length in the response");
  }
  return S3Object{key, static_cast<uint64_t>(r.content_length), r.etag};
}

S3Listing S3Client::list(const std::string& bucket, const std::string& prefix,
                         const std::string& delimiter, int page_size) {
  S3Listing listing;
  std::string token;
  for (;;) {
    std::map<std::string, std::string> params{
        {"list-type", "2"}, {"max-keys", std::to_string(page_size)}, {"prefix", prefix}};
    if (!delimiter.empty()) params["delimiter"] = delimiter;
    if (!token.empty()) params["continuation-token"] = token;
    const Request q("GET", "list", bucket, "", canonical_query(params));
    const Response r = perform(q);
    check(q, r);
    for (std::string_view c : xml_elements(r.body, "Contents")) {
      listing.objects.push_back(
          {xml_text(c, "Key"), parse_u64(xml_text(c, "Size"), q), unquote(xml_text(c, "ETag"))});
    }
    for (std::string_view c : xml_elements(r.body, "CommonPrefixes")) {
      listing.prefixes.push_back(xml_text(c, "Prefix"));
    }
    const std::string next = xml_text(r.body, "NextContinuationToken");
    if (xml_text(r.body, "IsTruncated") != "true" || next.empty() || next == token) break;
    token = next;
  }
  return listing;
}

void S3Client::delete_object(const std::string& bucket, const std::string& key) {
  const Request q("DELETE", "DELETE", bucket, key);
  check(q, perform(q));
}

void S3Client::delete_objects(const std::string& bucket, const std::vector<std::string>& keys) {
  for (size_t begin = 0; begin < keys.size(); begin += 1000) {
    const size_t end = std::min(keys.size(), begin + 1000);
    std::string xml = "<Delete><Quiet>true</Quiet>";
    for (size_t i = begin; i < end; ++i)
      xml += "<Object><Key>" + xml_escape(keys[i]) + "</Key></Object>";
    xml += "</Delete>";
    Request q("POST", "delete " + std::to_string(end - begin) + " objects from", bucket, "",
              canonical_query({{"delete", ""}}));
    q.body = xml.data();
    q.body_size = xml.size();
    const Response r = perform(q);
    check(q, r);
    const auto errors = xml_elements(r.body, "Error");
    if (!errors.empty()) {
      throw_error(ErrorCode::kIo,
                  "could not DELETE " + s3_name(bucket, xml_text(errors[0], "Key")) + ": " +
                      xml_text(errors[0], "Code") + ": " + xml_text(errors[0], "Message") + " (" +
                      std::to_string(errors.size()) + " of " + std::to_string(end - begin) +
                      " keys failed)");
    }
  }
}

void S3Client::create_bucket(const std::string& bucket) {
  std::string xml;
  if (config_.region != "us-east-1") {
    xml = "<CreateBucketConfiguration><LocationConstraint>" + xml_escape(config_.region) +
          "</LocationConstraint></CreateBucketConfiguration>";
  }
  Request q("PUT", "create the bucket", bucket);
  q.body = xml.data();
  q.body_size = xml.size();
  const Response r = perform(q);
  if (r.code == "BucketAlreadyOwnedByYou") return;
  check(q, r);
}

std::string md5_hex(const void* data, size_t n) { return digest(EVP_md5(), data, n, false); }

}  // namespace tsnap::io
