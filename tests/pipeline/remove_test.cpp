// Removing snapshots and trees (tsnap/remove.h): a removed snapshot is never listed half gone,
// a missing one is IoError(kNotFound), and remove_tree removes nested trees and symlinks
// without following them.

#include "tsnap/remove.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "support/test_util.h"
#include "tsnap/catalog.h"
#include "tsnap/error.h"
#include "tsnap/save.h"

namespace tsnap {
namespace {

namespace fs = std::filesystem;
using test_support::TempDir;

TEST(RemoveSnapshot, RemovesACommittedSnapshotAndKeepsTheOthers) {
  TempDir dir;
  StateDict sd;
  sd.insert("w", test_support::make_tensor(at::kFloat, {64}, 1));
  save(dir / "a", sd);
  save(dir / "b", sd);
  remove_snapshot(dir / "a");
  const std::vector<Listed> left = list(dir.path());
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].name, "b");
  EXPECT_TRUE(left[0].committed);
  EXPECT_EQ(test_support::dir_entries(dir.path()), std::vector<std::string>{"b"});
}

TEST(RemoveSnapshot, AMissingSnapshotIsNotFound) {
  TempDir dir;
  try {
    remove_snapshot(dir / "nope");
    FAIL() << "expected kNotFound";
  } catch (const IoError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("nope"), std::string::npos) << e.what();
  }
}

TEST(RemoveTree, RemovesNestedTreesWithoutFollowingLinks) {
  TempDir dir;
  TempDir outside;
  std::ofstream(outside / "keep") << "x";
  fs::create_directories(dir / "t/a/b");
  std::ofstream(dir / "t/a/b/f") << "y";
  ASSERT_EQ(::symlink(outside.path().c_str(), (dir / "t/link").c_str()), 0);
  remove_tree(dir / "t");
  EXPECT_FALSE(fs::exists(dir / "t"));
  EXPECT_TRUE(fs::exists(outside / "keep"));
  EXPECT_NO_THROW(remove_tree(dir / "t"));  // a missing path is success
}

}  // namespace
}  // namespace tsnap
