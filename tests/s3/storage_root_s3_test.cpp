// The storage-root conformance suites (support/storage_root_suite.h: read and write sides) against
// an S3 prefix on the tests' server; tests/format/ runs it against a directory root.

#include <unistd.h>

#include <cstdlib>

#include "support/s3_server.h"
#include "support/storage_root_suite.h"

namespace tsnap::test_support {
namespace {

class S3Backend final : public StorageRootBackend {
 public:
  std::string fresh_root() override {
    S3Server& s3 = S3Server::shared();
    if (!s3.available()) {
      why_ = s3.why();
      return "";
    }
    s3.export_environment();
    const std::string bucket = "tsnap-conformance-" + std::to_string(::getpid());
    io::S3Client(s3.config()).create_bucket(bucket);
    static int next = 0;  // one count for every suite's backend: roots never repeat
    return "s3://" + bucket + "/root-" + std::to_string(next++);
  }
  std::string why() const override { return why_; }
  void make_partial(const std::string& root, const std::string& name) override {
    const io::S3Url at = io::S3Url::parse(root + "/" + name + "/r0-0.safetensors");
    io::S3Client(S3Server::shared().config()).put_object(at.bucket, at.prefix, "partial", 7);
  }
  std::string kind() const override { return "s3"; }

 private:
  std::string why_;
};

INSTANTIATE_TEST_SUITE_P(ObjectStorage, StorageRootSuite,
                         ::testing::Values(std::make_shared<S3Backend>()),
                         [](const auto& info) { return info.param->kind(); });
INSTANTIATE_TEST_SUITE_P(ObjectStorage, DurableStoreSuite,
                         ::testing::Values(std::make_shared<S3Backend>()),
                         [](const auto& info) { return info.param->kind(); });

}  // namespace
}  // namespace tsnap::test_support
