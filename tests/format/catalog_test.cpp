// tsnap::latest and tsnap::list with unfinished saves and corrupt snapshots lying around.

#include "tsnap/catalog.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "restore/restore_util.h"
#include "tsnap/save.h"

namespace tsnap {
namespace {

namespace fs = std::filesystem;
using test_support::TempDir;

TEST(Latest, SkipsTemporariesAndCorruptSnapshots) {
  TempDir dir;
  const StateDict sd{{"w", at::ones({2})}};
  save(dir / "step-100", sd, {{"step", 100}});
  save(dir / "step-300", sd, {{"step", 300}});
  save(dir / "step-200", sd, {{"step", 200}});
  // A newer save that never committed: its temporary directory holds a complete manifest.
  fs::copy(dir / "step-300", dir / ".step-400.tmp-1234");
  test_support::set_format_version(dir / ".step-400.tmp-1234", kFormatVersion);
  // A newer snapshot whose manifest is corrupt, and one without a manifest at all.
  save(dir / "step-500", sd, {{"step", 500}});
  std::ofstream(dir / "step-500" / kManifestName) << "{\"format\": \"tsnap\", \"format_ver";
  save(dir / "step-600", sd, {{"step", 600}});
  fs::remove(dir / "step-600" / kManifestName);

  EXPECT_EQ(latest(dir.path()), dir / "step-300");
  const std::vector<Listed> all = list(dir.path());
  ASSERT_EQ(all.size(), 6u);
  int committed = 0, temporary = 0;
  for (const Listed& l : all) {
    committed += l.committed;
    temporary += l.temporary;
    if (!l.committed) EXPECT_FALSE(l.problem.empty()) << l.name;
  }
  EXPECT_EQ(committed, 3);
  EXPECT_EQ(temporary, 1);
}

TEST(Latest, WithoutStepMetadataTheNewestWins) {
  TempDir dir;
  const StateDict sd{{"w", at::ones({2})}};
  save(dir / "b", sd);
  save(dir / "a", sd);
  EXPECT_EQ(latest(dir.path()), dir / "a");
  EXPECT_FALSE(latest(dir / "missing").has_value());
}

}  // namespace
}  // namespace tsnap
