// The S3 client against a real S3-protocol server (moto, started by the tests on 127.0.0.1 with
// credentials and signature checks on): objects, ranged reads, multipart uploads and their
// resumption, listings, deletes, and the errors of wrong credentials, an unreachable endpoint
// and missing keys.

#include "io/s3_client.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support/s3_server.h"
#include "tsnap/error.h"

namespace tsnap::io {
namespace {

using test_support::S3Server;

constexpr size_t kMiB = 1024 * 1024;

std::string random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// What a tsnap::Error thrown by a call was.
struct Caught {
  ErrorCode code = ErrorCode::kInternal;
  std::string what;
  bool io = false;      // an IoError
  bool format = false;  // a FormatError
};

// The error `f` throws (fails the test when it throws none).
template <typename F>
Caught error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return {e.code(), e.what(), dynamic_cast<const IoError*>(&e) != nullptr,
            dynamic_cast<const FormatError*>(&e) != nullptr};
  }
  ADD_FAILURE() << "no tsnap::Error thrown";
  return {};
}

class S3ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    S3Server& server = S3Server::shared();
    if (!server.available()) GTEST_SKIP() << server.why();
    client_ = std::make_unique<S3Client>(server.config());
    // One bucket per test: "tsnap-<test name>".
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return std::isalnum(c) ? std::tolower(c) : '-'; });
    bucket_ = ("tsnap-" + name).substr(0, 63);
    client_->create_bucket(bucket_);
  }

  // The whole object `key` (a HEAD, then a GET of what it found).
  std::string get(const std::string& key) {
    const std::optional<S3Object> head = client_->head_object(bucket_, key);
    if (!head) ADD_FAILURE() << key << " does not exist";
    return head ? client_->get_object(bucket_, *head) : "";
  }

  std::unique_ptr<S3Client> client_;
  std::string bucket_;
};

TEST_F(S3ClientTest, PutGetHeadAndRanges) {
  const std::string data = random_bytes(kMiB + 13, 1);
  client_->put_object(bucket_, "dir/obj.bin", data.data(), data.size());
  EXPECT_EQ(get("dir/obj.bin"), data);

  const auto head = client_->head_object(bucket_, "dir/obj.bin");
  ASSERT_TRUE(head.has_value());
  EXPECT_EQ(head->size, data.size());
  EXPECT_EQ(head->etag.size(), 32u);  // the MD5 of a single-part object

  for (const auto& [offset, n] : std::vector<std::pair<uint64_t, size_t>>{
           {0, 1}, {0, data.size()}, {4095, 4097}, {data.size() - 1, 1}, {777, 100000}}) {
    std::string out(n, '\0');
    client_->get_range(bucket_, "dir/obj.bin", offset, out.data(), n);
    EXPECT_EQ(out, data.substr(offset, n)) << offset << "+" << n;
  }
  client_->get_range(bucket_, "dir/obj.bin", data.size() + 5, nullptr, 0);  // nothing to read

  // Past the end: a short object is a truncation, naming the key and the offset.
  std::string out(100, '\0');
  Caught e = error_of(
      [&] { client_->get_range(bucket_, "dir/obj.bin", data.size() - 10, out.data(), 100); });
  EXPECT_EQ(e.code, ErrorCode::kTruncated);
  EXPECT_TRUE(e.format);
  EXPECT_NE(e.what.find("s3://" + bucket_ + "/dir/obj.bin"), std::string::npos) << e.what;
  e = error_of(
      [&] { client_->get_range(bucket_, "dir/obj.bin", data.size() + 10, out.data(), 100); });
  EXPECT_EQ(e.code, ErrorCode::kTruncated) << e.what;
  EXPECT_NE(e.what.find(std::to_string(data.size() + 10)), std::string::npos) << e.what;

  // An empty object, and one overwritten.
  client_->put_object(bucket_, "empty", nullptr, 0);
  EXPECT_EQ(get("empty"), "");
  EXPECT_EQ(client_->head_object(bucket_, "empty")->size, 0u);
  client_->put_object(bucket_, "dir/obj.bin", "short", 5);
  EXPECT_EQ(get("dir/obj.bin"), "short");
}

TEST_F(S3ClientTest, KeysThatNeedEncoding) {
  // Keys and prefixes with characters that SigV4 canonicalisation percent-encodes.
  const std::vector<std::string> keys = {"a b/c+d=e&f", "ünï/cödé", "x/./y", "q?r#s%t",
                                         "tilde~*'()"};
  for (const std::string& key : keys) client_->put_object(bucket_, key, key.data(), key.size());
  for (const std::string& key : keys) EXPECT_EQ(get(key), key) << key;
  const S3Listing all = client_->list(bucket_, "");
  ASSERT_EQ(all.objects.size(), keys.size());
  const S3Listing spaced = client_->list(bucket_, "a b/", "/");
  ASSERT_EQ(spaced.objects.size(), 1u);
  EXPECT_EQ(spaced.objects[0].key, "a b/c+d=e&f");
}

TEST_F(S3ClientTest, MissingKeyIsNotFound) {
  Caught e = error_of([&] { client_->get_object(bucket_, S3Object{"no/such/key", 1, ""}); });
  EXPECT_EQ(e.code, ErrorCode::kNotFound);
  EXPECT_TRUE(e.io);
  EXPECT_NE(e.what.find("s3://" + bucket_ + "/no/such/key"), std::string::npos) << e.what;
  EXPECT_NE(e.what.find("404 NoSuchKey"), std::string::npos) << e.what;

  char byte;
  e = error_of([&] { client_->get_range(bucket_, "no/such/key", 0, &byte, 1); });
  EXPECT_EQ(e.code, ErrorCode::kNotFound) << e.what;
  EXPECT_FALSE(client_->head_object(bucket_, "no/such/key").has_value());
  e = error_of([&] { client_->get_object("tsnap-no-such-bucket", S3Object{"k", 1, ""}); });
  EXPECT_EQ(e.code, ErrorCode::kNotFound) << e.what;
  client_->delete_object(bucket_, "no/such/key");  // deleting nothing is no error
}

TEST_F(S3ClientTest, MultipartUploadAndReadsAcrossParts) {
  // Every part but the last at least 5 MiB, as S3 requires (and the server enforces).
  const std::vector<size_t> sizes = {5 * kMiB, 5 * kMiB + 3, kMiB + 7};
  std::string data;
  for (size_t i = 0; i < sizes.size(); ++i) data += random_bytes(sizes[i], 10 + i);
  const std::string key = "big/shard.safetensors";

  const std::string id = client_->create_multipart_upload(bucket_, key);
  ASSERT_FALSE(id.empty());
  std::vector<S3Part> parts;
  size_t offset = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int number = static_cast<int>(i) + 1;
    parts.push_back(client_->upload_part(bucket_, key, id, number, data.data() + offset, sizes[i]));
    offset += sizes[i];
  }
  EXPECT_FALSE(client_->head_object(bucket_, key).has_value());  // not there before completion
  client_->complete_multipart_upload(bucket_, key, id, parts);

  const auto head = client_->head_object(bucket_, key);
  ASSERT_TRUE(head.has_value());
  EXPECT_EQ(head->size, data.size());
  EXPECT_EQ(head->etag.substr(head->etag.size() - 2), "-3");
  // Ranges across the boundaries of the parts.
  for (const auto& [at, n] : std::vector<std::pair<uint64_t, size_t>>{
           {5 * kMiB - 100, 200}, {10 * kMiB + 3 - 1, 2}, {kMiB, 10 * kMiB}, {0, data.size()}}) {
    std::string out(n, '\0');
    client_->get_range(bucket_, key, at, out.data(), n);
    EXPECT_TRUE(out == data.substr(at, n)) << at << "+" << n;
  }
  EXPECT_TRUE(client_->list_multipart_uploads(bucket_, "").empty());
}

TEST_F(S3ClientTest, PartsBelowTheMinimumAreRefused) {
  const std::string small = random_bytes(1024, 3);
  const std::string id = client_->create_multipart_upload(bucket_, "small");
  const std::vector<S3Part> parts = {
      client_->upload_part(bucket_, "small", id, 1, small.data(), small.size()),
      client_->upload_part(bucket_, "small", id, 2, small.data(), small.size())};
  const Caught e =
      error_of([&] { client_->complete_multipart_upload(bucket_, "small", id, parts); });
  EXPECT_EQ(e.code, ErrorCode::kIo);
  EXPECT_NE(e.what.find("EntityTooSmall"), std::string::npos) << e.what;
  client_->abort_multipart_upload(bucket_, "small", id);
}

TEST_F(S3ClientTest, ResumeAndAbortUploads) {
  // A drain killed after two parts: a restart finds the upload and its parts, and finishes it.
  const std::string data = random_bytes(10 * kMiB + 100, 4);
  const std::string key = "snap/step-7/shard-0";
  const std::string id = client_->create_multipart_upload(bucket_, key);
  client_->upload_part(bucket_, key, id, 1, data.data(), 5 * kMiB);
  client_->upload_part(bucket_, key, id, 2, data.data() + 5 * kMiB, 5 * kMiB);
  const std::string other = client_->create_multipart_upload(bucket_, "elsewhere/x");

  const std::vector<S3Upload> uploads = client_->list_multipart_uploads(bucket_, "snap/");
  ASSERT_EQ(uploads.size(), 1u);
  EXPECT_EQ(uploads[0].key, key);
  EXPECT_EQ(uploads[0].upload_id, id);
  EXPECT_FALSE(uploads[0].initiated.empty());
  EXPECT_EQ(client_->list_multipart_uploads(bucket_, "").size(), 2u);

  std::vector<S3Part> parts = client_->list_parts(bucket_, key, id, /*page_size=*/1);  // 2 pages
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].number, 1);
  EXPECT_EQ(parts[1].number, 2);
  EXPECT_EQ(parts[1].size, 5 * kMiB);
  EXPECT_EQ(parts[0].etag.size(), 32u);
  parts.push_back(client_->upload_part(bucket_, key, id, 3, data.data() + 10 * kMiB, 100));
  client_->complete_multipart_upload(bucket_, key, id, parts);
  EXPECT_EQ(get(key), data);

  // Aborting frees the upload; a second abort, or listing its parts, finds no upload. (A part
  // for it is 404 NoSuchUpload on S3, but HTTP 500 on moto.)
  client_->abort_multipart_upload(bucket_, "elsewhere/x", other);
  EXPECT_TRUE(client_->list_multipart_uploads(bucket_, "").empty());
  EXPECT_EQ(error_of([&] { client_->abort_multipart_upload(bucket_, "elsewhere/x", other); }).code,
            ErrorCode::kNotFound);
  EXPECT_EQ(error_of([&] { client_->list_parts(bucket_, "elsewhere/x", other); }).code,
            ErrorCode::kNotFound);
}

TEST_F(S3ClientTest, ListPagesAndDelimiter) {
  std::vector<std::string> keys;
  for (int i = 0; i < 23; ++i)
    keys.push_back("root/snap-" + std::to_string(100 + i) + "/MANIFEST.json");
  for (int i = 0; i < 4; ++i) keys.push_back("root/file-" + std::to_string(i));
  keys.push_back("rootless");
  for (const std::string& k : keys) client_->put_object(bucket_, k, k.data(), k.size());
  std::sort(keys.begin(), keys.end());

  const S3Listing all = client_->list(bucket_, "root/", "", /*page_size=*/5);  // 6 pages
  ASSERT_EQ(all.objects.size(), 27u);
  for (size_t i = 0; i < all.objects.size(); ++i) {
    EXPECT_EQ(all.objects[i].key, keys[i]);
    EXPECT_EQ(all.objects[i].size, keys[i].size());
  }
  EXPECT_TRUE(all.prefixes.empty());

  const S3Listing top = client_->list(bucket_, "root/", "/", /*page_size=*/4);
  ASSERT_EQ(top.objects.size(), 4u);
  EXPECT_EQ(top.objects[0].key, "root/file-0");
  ASSERT_EQ(top.prefixes.size(), 23u);
  EXPECT_EQ(top.prefixes[0], "root/snap-100/");
  EXPECT_EQ(top.prefixes[22], "root/snap-122/");
  EXPECT_EQ(client_->list(bucket_, "").objects.size(), 28u);
  EXPECT_TRUE(client_->list(bucket_, "nothing/").objects.empty());
}

TEST_F(S3ClientTest, DeleteObjectsInBatches) {
  // More than one DeleteObjects request (1000 keys each), and more than one list page.
  std::vector<std::string> keys;
  for (int i = 0; i < 1003; ++i) keys.push_back("gc/" + std::to_string(i));
  for (const std::string& k : keys) client_->put_object(bucket_, k, "x", 1);
  client_->put_object(bucket_, "keep", "y", 1);
  EXPECT_EQ(client_->list(bucket_, "gc/").objects.size(), 1003u);
  client_->delete_objects(bucket_, keys);
  EXPECT_TRUE(client_->list(bucket_, "gc/").objects.empty());
  EXPECT_EQ(get("keep"), "y");
  client_->delete_objects(bucket_, {"keep", "never-was"});
  EXPECT_TRUE(client_->list(bucket_, "").objects.empty());
  client_->delete_objects(bucket_, {});
}

TEST_F(S3ClientTest, ConcurrentCallsOnOneClient) {
  std::vector<std::thread> threads;
  std::vector<int> ok(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        const std::string key = "t" + std::to_string(t) + "/" + std::to_string(i);
        const std::string data = random_bytes(1000 + 100 * t + i, t * 100 + i);
        client_->put_object(bucket_, key, data.data(), data.size());
        ok[t] += get(key) == data;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(ok[t], 10) << t;
}

// A process forked from one whose client holds kept-alive connections (S3 and LocalStack keep
// them open; moto closes each) makes connections of its own: parent and child calling at once
// each get their own answers, never the other's or a part of it.
TEST_F(S3ClientTest, AForkedChildUsesConnectionsOfItsOwn) {
  std::vector<std::string> data;
  for (int i = 0; i < 4; ++i) {
    data.push_back(random_bytes(64 * 1024 + i, 40 + i));
    client_->put_object(bucket_, "f" + std::to_string(i), data[i].data(), data[i].size());
  }
  // How many reads returned other bytes than the object's; throws what the client threw.
  const auto read_all = [&] {
    int wrong = 0;
    for (int round = 0; round < 25; ++round) {
      for (int i = 0; i < 4; ++i) {
        std::string got(data[i].size(), '\0');
        client_->get_range(bucket_, "f" + std::to_string(i), 0, got.data(), got.size());
        wrong += got != data[i];
        if (client_->list(bucket_, "f").objects.size() != 4) ++wrong;
      }
    }
    return wrong;
  };
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int status = 2;  // the client threw
    try {
      status = read_all() == 0 ? 0 : 1;
    } catch (...) {
    }
    ::_exit(status);
  }
  int wrong = -1;
  std::string error;
  try {
    wrong = read_all();
  } catch (const Error& e) {
    error = e.what();
  }
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (::waitpid(child, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(error, "");
  EXPECT_EQ(wrong, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "the child did not finish within 120 s";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child read wrong answers (1) or its client threw (2)";
}

// The conditional requests moto honours as S3 does: a PUT with If-None-Match: * stores nothing
// over an existing key, and a GET with the ETag of an earlier HEAD fails once the object
// changed.
TEST_F(S3ClientTest, ConditionalPutAndGet) {
  client_->put_object(bucket_, "once", "first", 5, /*if_absent=*/true);
  Caught e = error_of([&] { client_->put_object(bucket_, "once", "second", 6, true); });
  EXPECT_EQ(e.code, ErrorCode::kAlreadyExists) << e.what;
  EXPECT_NE(e.what.find("PUT s3://" + bucket_ + "/once at " + client_->config().endpoint),
            std::string::npos)
      << e.what;
  EXPECT_EQ(get("once"), "first");

  const std::optional<S3Object> head = client_->head_object(bucket_, "once");
  ASSERT_TRUE(head.has_value());
  client_->put_object(bucket_, "once", "replaced", 8);
  e = error_of([&] { client_->get_object(bucket_, *head); });
  EXPECT_EQ(e.code, ErrorCode::kNotFound) << e.what;
  EXPECT_NE(e.what.find("changed since its HEAD"), std::string::npos) << e.what;
  EXPECT_EQ(get("once"), "replaced");
}

TEST_F(S3ClientTest, CreateBucketTwiceIsFine) { client_->create_bucket(bucket_); }

TEST_F(S3ClientTest, WrongCredentialsAreRefused) {
  if (!S3Server::shared().checks_credentials()) GTEST_SKIP() << S3Server::kCredentialsUnchecked;
  client_->put_object(bucket_, "k", "v", 1);
  S3Config wrong_secret = S3Server::shared().config();
  wrong_secret.secret_key = "WrongSecretWrongSecretWrongSecret1234567";
  S3Config wrong_key = S3Server::shared().config();
  wrong_key.access_key = "AKIAWRONGWRONGWRONG0";
  for (const auto& [config, code] : {std::pair{wrong_secret, "SignatureDoesNotMatch"},
                                     std::pair{wrong_key, "InvalidAccessKeyId"}}) {
    S3Client client(config);
    for (const auto& call :
         std::vector<std::function<void()>>{[&] {
                                              client.get_object(bucket_, S3Object{"k", 1, ""});
                                            },
                                            [&] { client.put_object(bucket_, "k2", "v", 1); },
                                            [&] { client.list(bucket_, ""); }}) {
      const Caught e = error_of(call);
      const std::string& what = e.what;
      EXPECT_EQ(e.code, ErrorCode::kIo) << what;
      EXPECT_TRUE(e.io);
      EXPECT_NE(what.find("403"), std::string::npos) << what;
      EXPECT_NE(what.find(code), std::string::npos) << what;
      EXPECT_NE(what.find("refused the credentials"), std::string::npos) << what;
      EXPECT_NE(what.find("AWS_SECRET_ACCESS_KEY"), std::string::npos) << what;
      EXPECT_EQ(what.find(config.secret_key), std::string::npos) << what;
      EXPECT_EQ(what.find(S3Server::shared().config().secret_key), std::string::npos) << what;
    }
    // A HEAD has no body to carry S3's code: still the credentials.
    const Caught e = error_of([&] { client.head_object(bucket_, "k"); });
    EXPECT_NE(e.what.find("refused the credentials"), std::string::npos) << e.what;
  }
}

TEST(S3ClientUnreachable, ClosedPortFailsFastNamingTheEndpoint) {
  // A port nothing listens on: bound, then closed.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(fd);
  S3Config config;
  config.endpoint = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  config.region = "us-east-1";
  config.access_key = "AKIAEXAMPLE";
  config.secret_key = "secret-that-must-not-show";
  config.attempts = 3;
  config.connect_timeout_ms = 2000;
  S3Client client(config);
  const auto start = std::chrono::steady_clock::now();
  const Caught e = error_of([&] { client.get_object("bucket", S3Object{"key", 1, ""}); });
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, std::chrono::seconds(10));
  EXPECT_EQ(e.code, ErrorCode::kIo);
  const std::string& what = e.what;
  EXPECT_NE(what.find(" at " + config.endpoint + ": could not reach the S3 endpoint"),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("s3://bucket/key"), std::string::npos) << what;
  EXPECT_NE(what.find("3 attempts"), std::string::npos) << what;
  EXPECT_EQ(what.find(config.secret_key), std::string::npos) << what;
}

TEST(S3Url, ParsesBucketAndPrefix) {
  EXPECT_TRUE(S3Url::is_s3("s3://b"));
  EXPECT_FALSE(S3Url::is_s3("/local/dir"));
  S3Url u = S3Url::parse("s3://my-bucket/some/prefix/");
  EXPECT_EQ(u.bucket, "my-bucket");
  EXPECT_EQ(u.prefix, "some/prefix");
  EXPECT_EQ(u.key("step-1/MANIFEST.json"), "some/prefix/step-1/MANIFEST.json");
  EXPECT_EQ(u.str(), "s3://my-bucket/some/prefix");
  u = S3Url::parse("s3://my.bucket.1");
  EXPECT_EQ(u.prefix, "");
  EXPECT_EQ(u.key("x"), "x");
  EXPECT_EQ(u.str(), "s3://my.bucket.1");
  for (const char* bad :
       {"s3://", "s3:///p", "http://b/p", "s3://ab/p", "s3://Bucket/p", "s3://b_ucket/p",
        "s3://bucket//p", "s3://bucket/a/../b", "s3://-bucket/p"}) {
    const Caught e = error_of([&] { S3Url::parse(bad); });
    EXPECT_EQ(e.code, ErrorCode::kInvalidArgument) << bad;
  }
}

TEST(S3Config, FromEnvironment) {
  setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:1234", 1);
  setenv("AWS_ENDPOINT_URL", "http://ignored:1", 1);
  setenv("AWS_REGION", "eu-west-3", 1);
  setenv("AWS_ACCESS_KEY_ID", "AK", 1);
  setenv("AWS_SECRET_ACCESS_KEY", "SK", 1);
  setenv("AWS_SESSION_TOKEN", "TOK", 1);
  unsetenv("TSNAP_S3_PATH_STYLE");
  S3Config c = S3Config::from_environment();
  EXPECT_EQ(c.endpoint, "http://127.0.0.1:1234");
  EXPECT_EQ(c.region, "eu-west-3");
  EXPECT_EQ(c.access_key, "AK");
  EXPECT_EQ(c.secret_key, "SK");
  EXPECT_EQ(c.session_token, "TOK");
  EXPECT_TRUE(c.path_style);
  unsetenv("AWS_ENDPOINT_URL_S3");
  unsetenv("AWS_ENDPOINT_URL");
  unsetenv("AWS_REGION");
  setenv("AWS_DEFAULT_REGION", "ap-south-1", 1);
  c = S3Config::from_environment();
  EXPECT_EQ(c.endpoint, "https://s3.ap-south-1.amazonaws.com");
  EXPECT_EQ(c.region, "ap-south-1");
  EXPECT_FALSE(c.path_style);
  setenv("TSNAP_S3_PATH_STYLE", "1", 1);
  EXPECT_TRUE(S3Config::from_environment().path_style);
  for (const char* v : {"AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                        "AWS_SESSION_TOKEN", "TSNAP_S3_PATH_STYLE"}) {
    unsetenv(v);
  }
  EXPECT_EQ(S3Config::from_environment().region, "us-east-1");
}

}  // namespace
}  // namespace tsnap::io
