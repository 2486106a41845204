// The engine selection policies (save, load, exact), the test hook, and the file primitives
// (UniqueFd, read_full) of the io layer.

#include "io/engine_host.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <string>

#include "io/fd.h"
#include "support/test_util.h"
#include "tsnap/error.h"

namespace tsnap::io {
namespace {

using test_support::TempDir;

bool uring_available() {
  try {
    host_of(EngineKind::kUring, {});
    return true;
  } catch (const Error&) {
    return false;
  }
}

bool direct_on(const std::string& dir) { return probe_direct_io(*make_pwrite_engine(1), dir); }

EngineRequest request_of(EngineKind kind) {
  EngineRequest r;
  r.kind = kind;
  r.queue_depth = 8;
  r.io_threads = 2;
  return r;
}

/// Sets TSNAP_DISABLE_IO_URING=1 for its lifetime.
struct NoUring {
  NoUring() { ::setenv("TSNAP_DISABLE_IO_URING", "1", 1); }
  ~NoUring() { ::unsetenv("TSNAP_DISABLE_IO_URING"); }
};

TEST(SavePolicy, PwriteIsTakenWhenAskedFor) {
  TempDir dir;
  const auto host = host_for_save(request_of(EngineKind::kPwrite), true, dir.path().string());
  EXPECT_EQ(host->engine().name(), "pwrite");
  EXPECT_EQ(host->direct(), direct_on(dir.path().string()));
  const auto buffered = host_for_save(request_of(EngineKind::kPwrite), false, dir.path().string());
  EXPECT_FALSE(buffered->direct());
  EXPECT_EQ(buffered->name(), "pwrite");
}

TEST(SavePolicy, AutoTakesIoUringWithDirectIoWhereBothWork) {
  TempDir dir;
  if (!uring_available() || !direct_on(dir.path().string())) {
    GTEST_SKIP() << "io_uring or O_DIRECT unavailable here";
  }
  const auto host = host_for_save(request_of(EngineKind::kAuto), true, dir.path().string());
  EXPECT_EQ(host->name(), "io_uring+O_DIRECT");
  const auto buffered = host_for_save(request_of(EngineKind::kAuto), false, dir.path().string());
  EXPECT_EQ(buffered->name(), "io_uring");
}

TEST(SavePolicy, AutoFallsBackToPwriteWhereODirectIsRefused) {
  if (!std::filesystem::is_directory("/dev/shm") || direct_on("/dev/shm")) {
    GTEST_SKIP() << "no tmpfs without O_DIRECT here";
  }
  TempDir dir("/dev/shm");
  const auto host = host_for_save(request_of(EngineKind::kAuto), true, dir.path().string());
  EXPECT_EQ(host->name(), "pwrite");
}

TEST(SavePolicy, WithoutIoUringAutoFallsBackAndUringThrows) {
  TempDir dir;
  NoUring off;
  const auto host = host_for_save(request_of(EngineKind::kAuto), true, dir.path().string());
  EXPECT_EQ(host->engine().name(), "pwrite");
  try {
    host_for_save(request_of(EngineKind::kUring), true, dir.path().string());
    FAIL() << "expected kUnsupported";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("TSNAP_DISABLE_IO_URING"), std::string::npos) << e.what();
  }
}

TEST(LoadPolicy, AutoTakesIoUringOnlyForDirectReads) {
  const auto cached = host_for_load(request_of(EngineKind::kAuto), false);
  EXPECT_EQ(cached->name(), "pwrite");
  if (!uring_available()) GTEST_SKIP() << "io_uring unavailable here";
  const auto direct = host_for_load(request_of(EngineKind::kAuto), true);
  EXPECT_EQ(direct->name(), "io_uring+O_DIRECT");
  const auto forced = host_for_load(request_of(EngineKind::kUring), false);
  EXPECT_EQ(forced->name(), "io_uring");
}

TEST(LoadPolicy, WithoutIoUringUringThrowsAndAutoReadsWithPread) {
  NoUring off;
  EXPECT_EQ(host_for_load(request_of(EngineKind::kAuto), true)->name(), "pwrite+O_DIRECT");
  try {
    host_for_load(request_of(EngineKind::kUring), true);
    FAIL() << "expected kUnsupported";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
}

TEST(ExactHost, RunsTheEngineAskedFor) {
  EXPECT_EQ(host_of(EngineKind::kPwrite, {})->name(), "pwrite");
  NoUring off;
  EXPECT_THROW(host_of(EngineKind::kUring, {}), Error);
}

TEST(ScopedEngineOverride, EveryPolicyRunsTheGivenEngineWhileItLives) {
  TempDir dir;
  const std::shared_ptr<Engine> mine = make_pwrite_engine(1);
  {
    ScopedEngineOverride use(mine);
    EXPECT_EQ(
        host_for_save(request_of(EngineKind::kUring), true, dir.path().string())->shared_engine(),
        mine);
    EXPECT_EQ(host_for_load(request_of(EngineKind::kAuto), false)->shared_engine(), mine);
  }
  EXPECT_NE(host_for_load(request_of(EngineKind::kAuto), false)->shared_engine(), mine);
}

bool is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

TEST(UniqueFd, ClosesOnceOnEveryPath) {
  TempDir dir;
  const std::string path = (dir / "f").string();
  int err = 0;
  UniqueFd a = open_fd(path, O_WRONLY | O_CREAT, 0644, &err);
  ASSERT_EQ(err, 0);
  const int raw = a.get();
  EXPECT_TRUE(is_open(raw));
  UniqueFd b = std::move(a);
  EXPECT_FALSE(a.valid());
  EXPECT_EQ(b.get(), raw);
  EXPECT_EQ(b.close(), 0);
  EXPECT_FALSE(is_open(raw));
  EXPECT_EQ(b.close(), 0);  // empty: nothing to close
  {
    UniqueFd c = open_fd(path, O_RDONLY, 0, &err);
    ASSERT_TRUE(c.valid());
    const int kept = c.release();
    EXPECT_FALSE(c.valid());
    EXPECT_TRUE(is_open(kept));
    c.reset(kept);
  }
  UniqueFd missing = open_fd((dir / "nope").string(), O_RDONLY, 0, &err);
  EXPECT_FALSE(missing.valid());
  EXPECT_EQ(err, -ENOENT);
}

TEST(ReadFull, ReadsWholeRangesAndStopsAtEndOfFile) {
  TempDir dir;
  const std::string path = (dir / "f").string();
  std::ofstream(path) << "0123456789";
  int err = 0;
  const UniqueFd fd = open_fd(path, O_RDONLY, 0, &err);
  char buf[16] = {};
  EXPECT_EQ(read_full(fd.get(), buf, 4, 3), 4);
  EXPECT_EQ(std::string(buf, 4), "3456");
  EXPECT_EQ(read_full(fd.get(), buf, 16, 6), 4);  // short only at end of file
  EXPECT_EQ(std::string(buf, 4), "6789");
  EXPECT_EQ(read_full(fd.get(), buf, 4, 100), 0);
  EXPECT_EQ(read_full(-1, buf, 4, 0), -EBADF);
}

}  // namespace
}  // namespace tsnap::io
