// Stale temporaries: removed by the next writer that starts alone on the root, never while a
// live writer (in this process or another, or with a save in flight) holds the root.

#include "pipeline/root_lock.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "format/layout.h"
#include "io/engine.h"
#include "pipeline/commit.h"
#include "policy/policy_test_util.h"
#include "support/on_engine.h"
#include "tsnap/load.h"

namespace tsnap {
namespace {

namespace fs = std::filesystem;
using test_support::TempDir;

// A temporary directory as a crashed save leaves it: a shard file, no manifest.
fs::path make_temporary(const fs::path& root, const std::string& name) {
  const fs::path dir = root / format::temporary_name(name, format::new_save_id());
  fs::create_directory(dir);
  std::ofstream(dir / "shard-00000-of-00001.safetensors") << "partial";
  return dir;
}

TEST(RootLock, NextWriterAloneRemovesStaleTemporaries) {
  TempDir dir;
  test_support::save_step(dir.path(), "step-00000001", 1, test_support::small_state(1));
  const fs::path stale = make_temporary(dir.path(), "step-00000002");
  fs::create_directory(dir / ".foreign.tmp-not-ours");
  {
    Snapshotter snap(test_support::small_options(dir.path()));
    EXPECT_FALSE(fs::exists(stale));
  }
  EXPECT_TRUE(fs::exists(dir / ".foreign.tmp-not-ours"));
  EXPECT_NO_THROW(load(dir / "step-00000001"));
}

TEST(RootLock, ProbeFilesOfAWriterKilledWhileProbingAreRemovedAndNoneAreLeft) {
  TempDir dir;
  const fs::path stale = dir / (std::string(io::kDirectProbePrefix) + "424242");
  std::ofstream(stale) << "x";
  { Snapshotter writer(test_support::small_options(dir.path())); }
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(test_support::dir_entries(dir.path()).empty());
}

TEST(RootLock, LiveWriterInThisProcessKeepsItsTemporaries) {
  TempDir dir;
  fs::path temporary;
  {
    Snapshotter owner(test_support::small_options(dir.path()));
    temporary = make_temporary(dir.path(), "step-00000003");
    {
      Snapshotter other(test_support::small_options(dir.path()));
      EXPECT_TRUE(fs::exists(temporary));
    }
    EXPECT_TRUE(fs::exists(temporary));
  }
  Snapshotter next(test_support::small_options(dir.path()));
  EXPECT_FALSE(fs::exists(temporary));
}

TEST(RootLock, SaveInFlightSurvivesANewWriter) {
  TempDir dir;
  auto gate = std::make_shared<test_support::GateEngine>();
  Snapshotter owner = test_support::on_engine(
      gate, [&] { return Snapshotter(test_support::small_options(dir.path())); });
  const StateDict sd = test_support::small_state(7);
  SaveHandle h = owner.save_async("step-00000001", sd);  // its commit waits at the gate
  bool temporary_seen = false;
  for (const std::string& e : test_support::dir_entries(dir.path())) {
    temporary_seen |= format::is_temporary(e);
  }
  EXPECT_TRUE(temporary_seen);
  { Snapshotter other(test_support::small_options(dir.path())); }
  gate->open_gate();
  h.wait();
  EXPECT_TRUE(test_support::bitwise_equal(load(dir / "step-00000001").at("w"), sd.at("w")));
}

TEST(RootLock, LiveWriterInAnotherProcessThenKilled) {
  TempDir dir;
  int ready[2], hold[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(hold), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pipeline::RootLock lock(dir.path());
    char c = 1;
    (void)!::write(ready[1], &c, 1);
    (void)!::read(hold[0], &c, 1);  // until killed
    ::_exit(0);
  }
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  const fs::path temporary = make_temporary(dir.path(), "step-00000004");
  {
    pipeline::RootLock lock(dir.path());
    EXPECT_TRUE(lock.locked());
    EXPECT_EQ(lock.removed(), 0);
    EXPECT_TRUE(fs::exists(temporary)) << "removed while its writer was alive";
  }
  ::kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status));
  pipeline::RootLock after(dir.path());
  EXPECT_EQ(after.removed(), 1);
  EXPECT_FALSE(fs::exists(temporary));
  for (int fd : {ready[0], ready[1], hold[0], hold[1]}) ::close(fd);
}

}  // namespace
}  // namespace tsnap
