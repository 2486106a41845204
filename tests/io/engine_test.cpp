// One suite, run against every engine (TEST_P): whole-buffer writes and reads at offsets,
// O_DIRECT, errors as -errno, many requests in flight.

#include "io/engine.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <optional>
#include <thread>
#include <vector>

#include "io/engine_host.h"
#include "io/fault_engine.h"
#include "support/test_util.h"
#include "tsnap/error.h"

namespace tsnap::io {
namespace {

class EngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const EngineKind kind = GetParam() == "io_uring" ? EngineKind::kUring : EngineKind::kPwrite;
    EngineRequest request;
    request.queue_depth = 16;
    request.io_threads = 3;
    try {
      host_ = host_of(kind, request);
    } catch (const Error& e) {
      GTEST_SKIP() << e.what();
    }
    engine_ = host_->shared_engine();
  }
  void TearDown() override {
    engine_.reset();
    host_.reset();
  }

  int sync_write(int fd, const void* buf, size_t len, uint64_t off) {
    std::promise<int> p;
    engine_->write(fd, buf, len, off, -1, [&](int rc) { p.set_value(rc); });
    return p.get_future().get();
  }
  int sync_read(int fd, void* buf, size_t len, uint64_t off) {
    std::promise<int> p;
    engine_->read(fd, buf, len, off, -1, [&](int rc) { p.set_value(rc); });
    return p.get_future().get();
  }

  std::unique_ptr<EngineHost> host_;
  std::shared_ptr<Engine> engine_;
  test_support::TempDir dir_;
};

struct AlignedBuffer {
  explicit AlignedBuffer(size_t n) : size(n) {
    if (posix_memalign(&p, 4096, n) != 0) throw std::bad_alloc();
  }
  ~AlignedBuffer() { std::free(p); }
  uint8_t* data() { return static_cast<uint8_t*>(p); }
  void* p = nullptr;
  size_t size;
};

TEST_P(EngineTest, WritesAndReadsBackAtOffsets) {
  const std::string path = (dir_ / "f").string();
  const int fd = engine_->open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> a(10000), b(5000);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 7);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 13 + 1);
  EXPECT_EQ(sync_write(fd, a.data(), a.size(), 0), 0);
  EXPECT_EQ(sync_write(fd, b.data(), b.size(), 20000), 0);
  std::vector<uint8_t> back(25000);
  EXPECT_EQ(sync_read(fd, back.data(), back.size(), 0), 25000);
  EXPECT_EQ(std::memcmp(back.data(), a.data(), a.size()), 0);
  EXPECT_EQ(std::memcmp(back.data() + 20000, b.data(), b.size()), 0);
  // Reading past the end returns what is there.
  EXPECT_EQ(sync_read(fd, back.data(), 100, 24950), 50);
  EXPECT_EQ(engine_->fsync(fd), 0);
  EXPECT_EQ(engine_->close(fd), 0);
}

TEST_P(EngineTest, DirectIoWholeBlocks) {
  if (!probe_direct_io(*engine_, dir_.path().string())) GTEST_SKIP() << "no O_DIRECT here";
  const std::string path = (dir_ / "d").string();
  const int fd = engine_->open(path, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0644);
  ASSERT_GE(fd, 0);
  AlignedBuffer buf(1 << 20);
  for (size_t i = 0; i < buf.size; ++i) buf.data()[i] = static_cast<uint8_t>(i % 251);
  EXPECT_EQ(sync_write(fd, buf.data(), buf.size, 4096), 0);
  AlignedBuffer back(1 << 20);
  EXPECT_EQ(sync_read(fd, back.data(), back.size, 4096), static_cast<int>(back.size));
  EXPECT_EQ(std::memcmp(buf.data(), back.data(), buf.size), 0);
  EXPECT_EQ(engine_->ftruncate(fd, 4096 + 1000), 0);
  engine_->close(fd);
  EXPECT_EQ(std::filesystem::file_size(path), 5096u);
}

TEST_P(EngineTest, ErrorsComeBackAsNegativeErrno) {
  char c = 0;
  EXPECT_EQ(sync_write(-1, &c, 1, 0), -EBADF);
  EXPECT_EQ(sync_read(-1, &c, 1, 0), -EBADF);
  EXPECT_EQ(engine_->open((dir_ / "missing" / "x").string(), O_RDONLY, 0), -ENOENT);
  EXPECT_EQ(
      engine_->rename((dir_ / "nope").string(), (dir_ / "x").string(), RenameMode::kNoReplace),
      -ENOENT);
}

TEST_P(EngineTest, ManyWritesInFlight) {
  const std::string path = (dir_ / "many").string();
  const int fd = engine_->open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  constexpr int kN = 200;  // more than the ring's depth: requests queue
  std::vector<std::vector<uint8_t>> bufs(kN, std::vector<uint8_t>(4096));
  std::atomic<int> left{kN}, failures{0};
  std::promise<void> all;
  for (int i = 0; i < kN; ++i) {
    std::fill(bufs[i].begin(), bufs[i].end(), static_cast<uint8_t>(i));
    engine_->write(fd, bufs[i].data(), 4096, static_cast<uint64_t>(i) * 4096, -1, [&](int rc) {
      if (rc != 0) ++failures;
      if (--left == 0) all.set_value();
    });
  }
  all.get_future().wait();
  EXPECT_EQ(failures, 0);
  std::vector<uint8_t> back(4096);
  for (int i = 0; i < kN; i += 37) {
    ASSERT_EQ(sync_read(fd, back.data(), 4096, static_cast<uint64_t>(i) * 4096), 4096);
    EXPECT_EQ(back[100], static_cast<uint8_t>(i));
  }
  engine_->close(fd);
}

TEST_P(EngineTest, RenameModes) {
  const auto a = dir_ / "a", b = dir_ / "b";
  std::filesystem::create_directory(a);
  std::filesystem::create_directory(b);
  std::ofstream(a / "x") << "A";
  EXPECT_EQ(engine_->rename(a.string(), b.string(), RenameMode::kNoReplace), -EEXIST);
  EXPECT_EQ(engine_->rename(a.string(), b.string(), RenameMode::kExchange), 0);
  EXPECT_TRUE(std::filesystem::exists(b / "x"));
  EXPECT_FALSE(std::filesystem::exists(a / "x"));
  EXPECT_EQ(engine_->fsync_dir(dir_.path().string()), 0);
}

TEST_P(EngineTest, FaultInjectorFailsTheNthCall) {
  FaultInjectingEngine faulty(engine_, {.fail_write = 2, .fail_fsync = 1, .error = EIO});
  const std::string path = (dir_ / "f").string();
  const int fd = faulty.open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  char c = 1;
  auto write_rc = [&] {
    std::promise<int> p;
    faulty.write(fd, &c, 1, 0, -1, [&](int rc) { p.set_value(rc); });
    return p.get_future().get();
  };
  EXPECT_EQ(write_rc(), 0);
  EXPECT_EQ(write_rc(), -EIO);
  EXPECT_EQ(write_rc(), 0);
  EXPECT_EQ(faulty.fsync(fd), -EIO);
  EXPECT_EQ(faulty.fsync(fd), 0);
  faulty.close(fd);
}

INSTANTIATE_TEST_SUITE_P(Engines, EngineTest, ::testing::Values("pwrite", "io_uring"),
                         [](const auto& info) {
                           return info.param == "io_uring" ? "uring" : "pwrite";
                         });

}  // namespace
}  // namespace tsnap::io
