#pragma once
/// \file
/// A client of the S3 protocol (AWS S3 and compatible stores) for draining snapshots to object
/// storage and restoring from it: objects, multipart uploads, ranged reads, listings, deletes.
///
/// Transport and signing are libcurl's (HTTP/1.1, TLS, connection reuse, AWS SigV4 through
/// CURLOPT_AWS_SIGV4); this file adds what S3 needs on top:
///  - every request carries `x-amz-content-sha256`: the SHA-256 of small XML bodies, and
///    `UNSIGNED-PAYLOAD` for object data, whose integrity the server checks against a checksum
///    signed with the request: by default `x-amz-checksum-crc32c` (S3's flexible checksums, as
///    the AWS SDKs send by default; multipart uploads declare CRC32C when they start and list
///    each part's in CompleteMultipartUpload), compared again with the one the server answers
///    with when it does; or, with `checksum = kMd5` for stores without flexible checksums,
///    `Content-MD5` and, where `verify_etag`, the returned ETag compared with the MD5 sent.
///    CRC-32C costs the client a fraction of MD5's CPU (io/crc32c.h): on a machine where the
///    client shares its cores, MD5 was the largest cost of an upload after the network;
///  - query strings are written in SigV4's canonical form (sorted, encoded, `name=value`), since
///    curl signs the query as given, and keys are percent-encoded the way S3 canonicalises them;
///  - transient failures (connection errors, timeouts, HTTP 408/429/500/502/503/504, SlowDown,
///    an error inside a 200 response) are retried with exponential backoff, `attempts` tries in
///    all, none begun once `retry_ms` have passed since the first; other 4xx answers are not;
///  - a hostile or broken endpoint is bounded: every attempt has a connect timeout and fails when
///    it moves fewer than `min_speed` bytes per second for `timeout_ms` (a server that accepts
///    and never answers, or answers a byte a second), and every answer has a cap on the bytes it
///    is read into memory: a ranged GET or a GET of a known size at most those bytes (a larger
///    Content-Length fails before any is read), an XML answer kMaxXmlBytes, an error body
///    kMaxErrorBytes. With the defaults a dead endpoint fails in about 30 s.
///
/// Errors are tsnap's (`throw_error`): a missing bucket, key or upload is `kNotFound`; refused or
/// expired credentials, an unreachable endpoint and any other failure `kIo`; an object shorter
/// than a range asked for `kTruncated`; an ETag that is not the MD5 of the bytes sent, or a
/// CRC-32C answered that is not the one sent, `kHashMismatch`; a conditional PUT of a key that
/// exists `kAlreadyExists`. Messages read "could not <operation> s3://bucket/key at <endpoint>:
/// ..." with the HTTP status and S3's error code and message; they never contain the secret key,
/// the session token or a signature.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/s3_xml.h"

namespace tsnap::io {

namespace s3_detail {
struct Request;
struct Response;
}  // namespace s3_detail

/// The most bytes of an error answer's body that are read (S3's are well under 1 KiB).
inline constexpr size_t kMaxErrorBytes = 64u << 10;

/// How the server checks the bytes of an upload (S3Config::checksum).
enum class S3Checksum {
  kCrc32c,  ///< `x-amz-checksum-crc32c` (S3's flexible checksums).
  kMd5,     ///< `Content-MD5` (every S3-compatible store has it; ~15x the CPU per byte).
};

/// Where and as whom to reach S3. Plain data; copy freely.
struct S3Config {
  std::string endpoint;       ///< "https://s3.us-east-1.amazonaws.com", "http://127.0.0.1:9000".
  std::string region;         ///< The SigV4 signing region, e.g. "us-east-1".
  std::string access_key;     ///< Empty: requests are sent unsigned (anonymous).
  std::string secret_key;     ///< Never logged nor put in an error message.
  std::string session_token;  ///< Temporary credentials' token (`x-amz-security-token`).
  bool path_style = true;     ///< endpoint/bucket/key; false: bucket.endpoint-host/key.
  long connect_timeout_ms = 5'000;  ///< Limit on establishing a connection (TCP and TLS).
  long timeout_ms = 10'000;         ///< An attempt slower than `min_speed` for this long fails.
  long min_speed = 1024;    ///< Bytes per second, either way, below which an attempt stalls.
  int attempts = 5;         ///< Tries per request, transient failures included (>= 1).
  long retry_ms = 30'000;   ///< No retry begins this long after the first began (0: no limit).
  bool verify_etag = true;  ///< Check ETag == MD5 on PUT and UploadPart (off for SSE-KMS).
  S3Checksum checksum = S3Checksum::kCrc32c;  ///< What uploads carry for the server to check.
  /// The certificate authorities an https endpoint is checked against (a PEM file); empty:
  /// libcurl's built-in default.
  std::string ca_bundle;

  /// The configuration of the environment: endpoint from AWS_ENDPOINT_URL_S3, else
  /// AWS_ENDPOINT_URL, else https://s3.<region>.amazonaws.com; region from AWS_REGION, else
  /// AWS_DEFAULT_REGION, else us-east-1; AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
  /// AWS_SESSION_TOKEN; path-style addressing from TSNAP_S3_PATH_STYLE (1/0), by default on for
  /// a custom endpoint and off for AWS's; TSNAP_S3_VERIFY_ETAG=0 turns the ETag check off;
  /// TSNAP_S3_CHECKSUM (crc32c or md5) picks `checksum`, as
  /// AWS_REQUEST_CHECKSUM_CALCULATION=when_required would for the AWS SDKs where a store lacks
  /// flexible checksums; the limits from TSNAP_S3_CONNECT_TIMEOUT_MS, TSNAP_S3_TIMEOUT_MS,
  /// TSNAP_S3_MIN_SPEED, TSNAP_S3_ATTEMPTS and TSNAP_S3_RETRY_MS (the defaults above when unset);
  /// the CA bundle from AWS_CA_BUNDLE, else SSL_CERT_FILE, else the first of the distributions'
  /// usual bundles that exists (Debian's, Red Hat's, SUSE's, Alpine's), so that a libcurl built for
  /// one distribution (the binary wheel's) finds another's. Errors: InvalidArgument naming a limit
  /// variable that is not a number in range (missing credentials mean anonymous requests).
  /// Thread-safety: reads the environment (do not setenv concurrently).
  static S3Config from_environment();
};

/// A location in object storage, "s3://bucket/prefix". Plain data.
struct S3Url {
  std::string bucket;  ///< A valid S3 bucket name.
  std::string prefix;  ///< The key prefix without leading or trailing '/', may be empty.

  /// Whether `url` starts with "s3://" (parse may still reject it).
  static bool is_s3(std::string_view url);
  /// "s3://bucket/some/prefix" -> {"bucket", "some/prefix"}; a trailing '/' is dropped.
  /// Errors: InvalidArgument (kInvalidArgument) for another scheme, a bad bucket name, or an
  /// empty, "." or ".." path segment. Thread-safety: pure.
  static S3Url parse(std::string_view url);
  /// The key of `rel` under the prefix: "some/prefix/rel" ("rel" when the prefix is empty).
  std::string key(std::string_view rel) const;
  /// "s3://bucket/prefix" (or "s3://bucket").
  std::string str() const;
};

/// What list() found.
struct S3Listing {
  std::vector<S3Object> objects;      ///< In key order.
  std::vector<std::string> prefixes;  ///< Common prefixes (with `delimiter`), in order.
};

/// The MD5 of `n` bytes at `data` as 32 lower-case hex digits: the ETag S3 gives a part or a
/// single-part object of those bytes (to recognise parts already uploaded).
std::string md5_hex(const void* data, size_t n);

/// A connection to one S3 endpoint with one set of credentials.
/// Thread-safety: every method may be called from any number of threads at once; each call
/// borrows a curl handle from a pool (whose connections are kept alive between calls). A child
/// process made by fork() may go on using a client made before: it opens connections of its
/// own and leaves the parent's alone.
/// Ownership: owns its handles; destroy it only when no call is running. Calls block the
/// calling thread until done (retries included).
class S3Client {
 public:
  /// Errors: InvalidArgument when `config.endpoint` is not an http(s) URL or attempts < 1.
  explicit S3Client(S3Config config);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  /// The configuration it was made with.
  const S3Config& config() const { return config_; }

  /// Stores `n` bytes at `data` as object `key` (PutObject, at most 5 GiB), with its checksum.
  /// With `if_absent` the PUT is conditional (`If-None-Match: *`): it stores nothing when the
  /// key exists, and throws Error(kAlreadyExists) (S3's 412 PreconditionFailed).
  void put_object(const std::string& bucket, const std::string& key, const void* data, size_t n,
                  bool if_absent = false);

  /// Starts a multipart upload of `key` (with CRC32C as its checksum algorithm, unless kMd5);
  /// returns its upload id.
  std::string create_multipart_upload(const std::string& bucket, const std::string& key);
  /// Uploads part `part_number` (1..10000; every part but the last at least 5 MiB) of an
  /// upload; returns it (number, size, ETag, checksum). Uploading a part number again replaces
  /// that part.
  S3Part upload_part(const std::string& bucket, const std::string& key,
                     const std::string& upload_id, int part_number, const void* data, size_t n);
  /// Joins `parts` (ascending part numbers, as upload_part or list_parts returned them) into the
  /// object. Errors: kNotFound when the upload is unknown (aborted, or completed before).
  void complete_multipart_upload(const std::string& bucket, const std::string& key,
                                 const std::string& upload_id, const std::vector<S3Part>& parts);
  /// Abandons an upload and frees its parts. Errors: kNotFound when the upload is unknown.
  void abort_multipart_upload(const std::string& bucket, const std::string& key,
                              const std::string& upload_id);
  /// The parts uploaded so far, in part order (all pages; `page_size` parts per request).
  std::vector<S3Part> list_parts(const std::string& bucket, const std::string& key,
                                 const std::string& upload_id, int page_size = 1000);
  /// The uploads in progress whose key starts with `prefix` (all pages).
  std::vector<S3Upload> list_multipart_uploads(const std::string& bucket, const std::string& prefix,
                                               int page_size = 1000);

  /// Reads exactly `n` bytes of `key` at `offset` into `out` (a ranged GET; n == 0 reads
  /// nothing). Errors: kNotFound for a missing key; FormatError kTruncated when the object
  /// ends before offset + n. `out` may be partly written on error.
  void get_range(const std::string& bucket, const std::string& key, uint64_t offset, void* out,
                 size_t n);
  /// The whole of the object `head` describes (head_object's answer; for small objects:
  /// manifests, markers): at most `head.size` bytes are accepted, and only while the object's
  /// ETag is still `head.etag` (If-Match). Errors: kNotFound when it is gone or has changed
  /// since the HEAD (then HEAD it again); kIo when the server sends more than `head.size`
  /// bytes; FormatError(kTruncated) when fewer.
  std::string get_object(const std::string& bucket, const S3Object& head);
  /// The object's size and ETag, or nullopt when there is no such key.
  std::optional<S3Object> head_object(const std::string& bucket, const std::string& key);

  /// The objects whose key starts with `prefix` and, with a non-empty `delimiter`, the common
  /// prefixes that roll up the keys with a `delimiter` after the prefix (ListObjectsV2, all
  /// pages; `page_size` keys per request, at most 1000).
  S3Listing list(const std::string& bucket, const std::string& prefix,
                 const std::string& delimiter = "", int page_size = 1000);

  /// Deletes `key` (no error when it does not exist).
  void delete_object(const std::string& bucket, const std::string& key);
  /// Deletes `keys` with DeleteObjects, 1000 per request. Errors: kIo naming the first key
  /// S3 could not delete, with its code.
  void delete_objects(const std::string& bucket, const std::vector<std::string>& keys);
  /// Creates `bucket` in the configured region; no error when it exists and is ours.
  /// Errors: kAlreadyExists when another account owns it.
  void create_bucket(const std::string& bucket);

 private:
  struct Pool;
  // One request, retried as the file comment says; throws on failures the caller cannot use.
  s3_detail::Response perform(const s3_detail::Request& q);

  S3Config config_;
  std::unique_ptr<Pool> pool_;
};

}  // namespace tsnap::io
