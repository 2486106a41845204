// The storage-root conformance suites (support/storage_root_suite.h: read and write sides) against
// a directory root; tests/s3/ runs it against an S3 prefix.

#include <fstream>

#include "support/storage_root_suite.h"

namespace tsnap::test_support {
namespace {

class DirBackend final : public StorageRootBackend {
 public:
  std::string fresh_root() override {
    dirs_.push_back(std::make_unique<TempDir>());
    return (dirs_.back()->path() / "root").string();
  }
  void make_partial(const std::string& root, const std::string& name) override {
    std::filesystem::create_directories(std::filesystem::path(root) / name);
    std::ofstream(std::filesystem::path(root) / name / "r0-0.safetensors") << "partial";
  }
  std::string kind() const override { return "directory"; }

 private:
  std::vector<std::unique_ptr<TempDir>> dirs_;
};

INSTANTIATE_TEST_SUITE_P(Directory, StorageRootSuite,
                         ::testing::Values(std::make_shared<DirBackend>()),
                         [](const auto& info) { return info.param->kind(); });
INSTANTIATE_TEST_SUITE_P(Directory, DurableStoreSuite,
                         ::testing::Values(std::make_shared<DirBackend>()),
                         [](const auto& info) { return info.param->kind(); });

}  // namespace
}  // namespace tsnap::test_support
