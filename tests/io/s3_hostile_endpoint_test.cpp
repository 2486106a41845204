// The S3 client against endpoints that are hostile or broken (a scripted HTTP server on
// 127.0.0.1, no S3 server needed): bodies that never end, answers that never come or trickle in
// a byte a second, listings too large or malformed, expired session tokens. Every call must
// fail within the limits the test sets, with a message that names the operation and the
// endpoint and holds no secret, and with memory bounded by the caps (io/s3_client.h).

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "io/s3_client.h"
#include "support/fake_http_server.h"
#include "tsnap/error.h"

namespace tsnap::io {
namespace {

using test_support::FakeHttpServer;
using Exchange = FakeHttpServer::Exchange;

constexpr const char* kSecret = "hostile-test-secret-key-0123456789abcdef";
constexpr const char* kToken = "hostile-test-session-token-FwoGZXIvYXdzEJr";

// Short limits, so that each failure comes in seconds.
S3Config config_for(const FakeHttpServer& server) {
  S3Config c;
  c.endpoint = server.endpoint();
  c.region = "us-east-1";
  c.access_key = "AKIDHOSTILETEST00000";
  c.secret_key = kSecret;
  c.session_token = kToken;
  c.connect_timeout_ms = 1000;
  c.timeout_ms = 1000;
  c.min_speed = 1024;
  c.attempts = 3;
  c.retry_ms = 2000;
  return c;
}

struct Failure {
  ErrorCode code = ErrorCode::kInternal;
  std::string what;
};

// The error `call` throws, checked for what every message must hold: the operation and
// object (`names`), the endpoint, and neither secret. The whole call, retries included, must
// end well within the ctest timeout: the limits above make it a few seconds.
template <typename F>
Failure failure_of(const S3Config& config, const std::string& names, F&& call) {
  const auto start = std::chrono::steady_clock::now();
  Failure f;
  try {
    call();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    f = {e.code(), e.what()};
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60)) << f.what;
  EXPECT_NE(f.what.find(names), std::string::npos) << f.what;
  EXPECT_NE(f.what.find(config.endpoint), std::string::npos) << f.what;
  EXPECT_EQ(f.what.find(kSecret), std::string::npos) << f.what;
  EXPECT_EQ(f.what.find(kToken), std::string::npos) << f.what;
  EXPECT_EQ(f.what.find("Signature="), std::string::npos) << f.what;
  return f;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A body that never ends, after `head` (the status line and headers).
void endless(Exchange& x, const std::string& head) {
  if (!x.send(head)) return;
  const std::string block(64 << 10, 'x');
  while (x.send(block)) {
  }
}

const char* kHead100 =
    "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nETag: \"e\"\r\nConnection: close\r\n\r\n";

TEST(S3HostileEndpoint, AnEndlessBodyStopsAtTheSizeTheHeadGave) {
  FakeHttpServer server([](Exchange& x) {
    if (x.method() == "HEAD") {
      x.send(kHead100);
    } else {
      endless(x, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n");  // no Content-Length
    }
  });
  const S3Config config = config_for(server);
  S3Client client(config);
  const std::optional<S3Object> head = client.head_object("bkt", "p/MANIFEST.json");
  ASSERT_TRUE(head.has_value());
  EXPECT_EQ(head->size, 100u);
  const Failure f =
      failure_of(config, "GET s3://bkt/p/MANIFEST.json", [&] { client.get_object("bkt", *head); });
  EXPECT_EQ(f.code, ErrorCode::kIo);
  EXPECT_TRUE(contains(f.what, "more than the 100 bytes")) << f.what;
}

TEST(S3HostileEndpoint, AContentLengthLargerThanAskedIsRefusedBeforeReading) {
  FakeHttpServer server([](Exchange& x) {
    endless(x,
            "HTTP/1.1 206 Partial Content\r\nContent-Length: 4294967296\r\n"
            "Content-Range: bytes 0-4294967295/4294967296\r\nConnection: close\r\n\r\n");
  });
  const S3Config config = config_for(server);
  S3Client client(config);
  char out[16];
  const Failure f = failure_of(config, "GET bytes 0-15 of s3://bkt/shard",
                               [&] { client.get_range("bkt", "shard", 0, out, sizeof out); });
  EXPECT_TRUE(contains(f.what, "Content-Length, 4294967296, is more than the 16 bytes")) << f.what;
  S3Object head{"obj", 100, ""};
  const Failure g = failure_of(config, "GET s3://bkt/obj", [&] { client.get_object("bkt", head); });
  EXPECT_TRUE(contains(g.what, "is more than the 100 bytes")) << g.what;
}

TEST(S3HostileEndpoint, AnEndlessErrorBodyIsCut) {
  FakeHttpServer server([](Exchange& x) {
    endless(x, "HTTP/1.1 503 Slow Down\r\nConnection: close\r\n\r\n<Error><Code>SlowDown</Code>");
  });
  const S3Config config = config_for(server);
  S3Client client(config);
  const Failure f =
      failure_of(config, "DELETE s3://bkt/k", [&] { client.delete_object("bkt", "k"); });
  EXPECT_TRUE(contains(f.what, "HTTP 503 SlowDown")) << f.what;
  EXPECT_TRUE(contains(f.what, "cut at 65536 bytes")) << f.what;
  EXPECT_GE(server.connections(), 2);  // 503 is retried
}

TEST(S3HostileEndpoint, AServerThatNeverAnswersFailsWithinTheLimits) {
  FakeHttpServer server([](Exchange& x) {
    while (x.sleep_ms(1000)) {
    }
  });
  const S3Config config = config_for(server);
  S3Client client(config);
  const Failure f = failure_of(config, "list s3://bkt", [&] { client.list("bkt", "p/"); });
  EXPECT_EQ(f.code, ErrorCode::kIo);
  EXPECT_TRUE(contains(f.what, "the S3 endpoint did not answer")) << f.what;
  // Three attempts of a second each and their pauses fit the 2 s retry window only twice.
  EXPECT_TRUE(contains(f.what, "2 attempts in")) << f.what;
  EXPECT_EQ(server.connections(), 2);
}

TEST(S3HostileEndpoint, AnAnswerAtOneBytePerSecondFails) {
  FakeHttpServer server([](Exchange& x) {
    const std::string answer = "HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n01234567890123456789";
    for (char c : answer) {
      if (!x.send(std::string(1, c)) || !x.sleep_ms(1000)) return;
    }
  });
  S3Config config = config_for(server);
  config.timeout_ms = 2000;
  config.attempts = 1;
  S3Client client(config);
  const Failure f = failure_of(config, "HEAD s3://bkt/k", [&] { client.head_object("bkt", "k"); });
  EXPECT_TRUE(contains(f.what, "Operation too slow")) << f.what;
}

TEST(S3HostileEndpoint, AHugeListingIsRefused) {
  FakeHttpServer server([](Exchange& x) {
    if (!x.send("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n<ListBucketResult>")) return;
    std::string entries;
    for (int i = 0; i < 512; ++i) entries += "<Contents><Key>k</Key><Size>1</Size></Contents>";
    while (x.send(entries)) {
    }
  });
  const S3Config config = config_for(server);
  S3Client client(config);
  const Failure f = failure_of(config, "list s3://bkt", [&] { client.list("bkt", ""); });
  EXPECT_TRUE(contains(f.what, "more than the " + std::to_string(kMaxXmlBytes) + " bytes"))
      << f.what;
}

TEST(S3HostileEndpoint, AListingThatNeverEndsIsRefused) {
  // Every page says another follows, with the same token.
  FakeHttpServer server([](Exchange& x) {
    const std::string page =
        "<ListBucketResult><IsTruncated>true</IsTruncated>"
        "<NextContinuationToken>again</NextContinuationToken></ListBucketResult>";
    x.send("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: " +
           std::to_string(page.size()) + "\r\n\r\n" + page);
  });
  const S3Config config = config_for(server);
  S3Client client(config);
  const Failure f = failure_of(config, "list s3://bkt", [&] { client.list("bkt", ""); });
  EXPECT_TRUE(contains(f.what, "same page marker twice")) << f.what;
}

// Answers every request with `status` and `body`.
FakeHttpServer::Handler answer(const std::string& status, const std::string& body) {
  return [=](Exchange& x) {
    x.send("HTTP/1.1 " + status + "\r\nConnection: close\r\nContent-Type: application/xml\r\n" +
           "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  };
}

TEST(S3HostileEndpoint, MalformedListingAndErrorBodies) {
  {
    FakeHttpServer server(answer("200 OK",
                                 "<ListBucketResult><Contents><Key>a</Key><Size>many</Size>"
                                 "</Contents></ListBucketResult>"));
    const S3Config config = config_for(server);
    S3Client client(config);
    const Failure f = failure_of(config, "list s3://bkt", [&] { client.list("bkt", ""); });
    EXPECT_EQ(f.code, ErrorCode::kIo);
    EXPECT_TRUE(contains(f.what, "malformed ListBucketResult answer: <Size> 'many'")) << f.what;
  }
  {
    FakeHttpServer server(answer("200 OK", "<ListBucketResult><Contents><Key>a</Key>"));
    const S3Config config = config_for(server);
    S3Client client(config);
    const Failure f = failure_of(config, "list s3://bkt", [&] { client.list("bkt", ""); });
    EXPECT_TRUE(contains(f.what, "is not closed")) << f.what;
  }
  {
    FakeHttpServer server(answer("400 Bad Request", "<Error><Code>Bro\xff<<ken&#;"));
    const S3Config config = config_for(server);
    S3Client client(config);
    const Failure f =
        failure_of(config, "PUT s3://bkt/k", [&] { client.put_object("bkt", "k", "v", 1); });
    EXPECT_EQ(f.code, ErrorCode::kIo);
    EXPECT_TRUE(contains(f.what, "HTTP 400")) << f.what;
    EXPECT_EQ(server.connections(), 1);  // a 400 is not retried
  }
  {
    FakeHttpServer server(answer("200 OK",
                                 "<InitiateMultipartUploadResult><Bucket>b</Bucket>"
                                 "</InitiateMultipartUploadResult>"));
    const S3Config config = config_for(server);
    S3Client client(config);
    const Failure f = failure_of(config, "start a multipart upload of s3://bkt/k",
                                 [&] { client.create_multipart_upload("bkt", "k"); });
    EXPECT_TRUE(contains(f.what, "without <UploadId>")) << f.what;
  }
}

TEST(S3HostileEndpoint, TokenErrorsAreCredentialErrorsAndEchoedSecretsAreRedacted) {
  for (const std::string code : {"ExpiredToken", "InvalidToken", "TokenRefreshRequired"}) {
    // The server echoes the token it was sent into its message.
    FakeHttpServer server([code](Exchange& x) {
      const std::string body = "<Error><Code>" + code + "</Code><Message>token " +
                               x.header("x-amz-security-token") + " and " + kSecret +
                               " refused</Message></Error>";
      x.send("HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: " +
             std::to_string(body.size()) + "\r\n\r\n" + body);
    });
    const S3Config config = config_for(server);
    S3Client client(config);
    const Failure f = failure_of(config, "GET s3://bkt/k", [&] {
      client.get_object("bkt", S3Object{"k", 10, ""});
    });
    EXPECT_EQ(f.code, ErrorCode::kIo);
    EXPECT_TRUE(contains(f.what, "HTTP 400 " + code)) << f.what;
    EXPECT_TRUE(contains(f.what, "refused the credentials")) << f.what;
    EXPECT_TRUE(contains(f.what, "AWS_SESSION_TOKEN")) << f.what;
    EXPECT_TRUE(contains(f.what, "<redacted>")) << f.what;
    EXPECT_EQ(server.connections(), 1);  // not retried
  }
}

TEST(S3HostileEndpoint, AConditionalPutOfAnExistingKeyIsAlreadyExists) {
  FakeHttpServer server([](Exchange& x) {
    if (x.header("if-none-match") != "*") {
      x.send("HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n");
      return;
    }
    const std::string body = "<Error><Code>PreconditionFailed</Code></Error>";
    x.send("HTTP/1.1 412 Precondition Failed\r\nConnection: close\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body);
  });
  const S3Config config = config_for(server);
  S3Client client(config);
  const Failure f = failure_of(config, "PUT s3://bkt/k",
                               [&] { client.put_object("bkt", "k", "v", 1, /*if_absent=*/true); });
  EXPECT_EQ(f.code, ErrorCode::kAlreadyExists);
  EXPECT_TRUE(contains(f.what, "the object exists")) << f.what;
}

// Uploads carry their CRC-32C (or, where asked, their MD5) for the server to check; an answer
// that gives back another CRC-32C than the one sent is a hash mismatch, not a success.
TEST(S3HostileEndpoint, UploadsCarryTheirChecksumAndAWrongAnswerIsAMismatch) {
  std::string sent_crc, sent_algorithm, sent_md5;
  bool lie = false;
  FakeHttpServer server([&](Exchange& x) {
    sent_crc = x.header("x-amz-checksum-crc32c");
    sent_algorithm = x.header("x-amz-sdk-checksum-algorithm");
    sent_md5 = x.header("content-md5");
    const std::string crc = lie ? "AAAAAA==" : sent_crc;
    x.send(
        "HTTP/1.1 200 OK\r\nConnection: close\r\nETag: \"5d41402abc4b2a76b9719d911017c592\"\r\n" +
        (crc.empty() ? std::string() : "x-amz-checksum-crc32c: " + crc + "\r\n") +
        "Content-Length: 0\r\n\r\n");
  });
  S3Config config = config_for(server);
  {
    S3Client client(config);
    client.put_object("bkt", "k", "hello", 5);
    EXPECT_EQ(sent_crc, "mnG7TA==");
    EXPECT_EQ(sent_algorithm, "CRC32C");
    EXPECT_EQ(sent_md5, "");
    lie = true;
    const Failure f =
        failure_of(config, "PUT s3://bkt/k", [&] { client.put_object("bkt", "k", "hello", 5); });
    EXPECT_EQ(f.code, ErrorCode::kHashMismatch);
    EXPECT_TRUE(contains(f.what, "'AAAAAA==', is not the one of the bytes sent (mnG7TA==)"))
        << f.what;
  }
  config.checksum = S3Checksum::kMd5;  // the ETag above is the MD5 of "hello"
  S3Client client(config);
  client.put_object("bkt", "k", "hello", 5);
  EXPECT_EQ(sent_crc, "");
  EXPECT_EQ(sent_md5, "XUFAKrxLKna5cZ2REBfFkg==");
  ::setenv("TSNAP_S3_CHECKSUM", "md5", 1);
  EXPECT_EQ(S3Config::from_environment().checksum, S3Checksum::kMd5);
  ::setenv("TSNAP_S3_CHECKSUM", "sha1", 1);
  EXPECT_THROW(S3Config::from_environment(), Error);
  ::unsetenv("TSNAP_S3_CHECKSUM");
  EXPECT_EQ(S3Config::from_environment().checksum, S3Checksum::kCrc32c);
}

TEST(S3HostileEndpoint, LimitsFromTheEnvironment) {
  ::setenv("TSNAP_S3_CONNECT_TIMEOUT_MS", "1500", 1);
  ::setenv("TSNAP_S3_TIMEOUT_MS", "2500", 1);
  ::setenv("TSNAP_S3_MIN_SPEED", "64", 1);
  ::setenv("TSNAP_S3_ATTEMPTS", "2", 1);
  ::setenv("TSNAP_S3_RETRY_MS", "0", 1);
  S3Config c = S3Config::from_environment();
  EXPECT_EQ(c.connect_timeout_ms, 1500);
  EXPECT_EQ(c.timeout_ms, 2500);
  EXPECT_EQ(c.min_speed, 64);
  EXPECT_EQ(c.attempts, 2);
  EXPECT_EQ(c.retry_ms, 0);
  // The CA bundle: AWS_CA_BUNDLE, else SSL_CERT_FILE, else the distribution's (this machine's).
  ::setenv("AWS_CA_BUNDLE", "/opt/ca/aws.pem", 1);
  ::setenv("SSL_CERT_FILE", "/opt/ca/ssl.pem", 1);
  EXPECT_EQ(S3Config::from_environment().ca_bundle, "/opt/ca/aws.pem");
  ::unsetenv("AWS_CA_BUNDLE");
  EXPECT_EQ(S3Config::from_environment().ca_bundle, "/opt/ca/ssl.pem");
  ::unsetenv("SSL_CERT_FILE");
  const std::string system = S3Config::from_environment().ca_bundle;
  EXPECT_TRUE(system.empty() || ::access(system.c_str(), R_OK) == 0) << system;
  ::setenv("TSNAP_S3_TIMEOUT_MS", "soon", 1);
  try {
    S3Config::from_environment();
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_TRUE(contains(e.what(), "TSNAP_S3_TIMEOUT_MS='soon'")) << e.what();
  }
  for (const char* v : {"TSNAP_S3_CONNECT_TIMEOUT_MS", "TSNAP_S3_TIMEOUT_MS", "TSNAP_S3_MIN_SPEED",
                        "TSNAP_S3_ATTEMPTS", "TSNAP_S3_RETRY_MS"}) {
    ::unsetenv(v);
  }
  c = S3Config::from_environment();
  EXPECT_EQ(c.timeout_ms, S3Config{}.timeout_ms);
  EXPECT_EQ(c.attempts, S3Config{}.attempts);
}

}  // namespace
}  // namespace tsnap::io
