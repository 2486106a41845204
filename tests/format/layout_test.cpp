// The on-disk naming rules (src/format/layout.h, docs/format.md §1).

#include "format/layout.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tsnap/error.h"

namespace tsnap::format {
namespace {

TEST(Layout, SaveIdsAreUniqueAndWellFormed) {
  const std::string a = new_save_id(), b = new_save_id();
  EXPECT_NE(a, b);
  ASSERT_EQ(a.size(), 25u);
  EXPECT_EQ(a[16], '-');
  EXPECT_TRUE(is_temporary(temporary_name("s", a)));
}

TEST(Layout, RecognisesOnlyTsnapTemporaries) {
  const std::string id = new_save_id();
  EXPECT_EQ(temporary_name("step-1", id), ".step-1.tmp-" + id);
  EXPECT_TRUE(is_temporary(".step-1.tmp-" + id));
  EXPECT_TRUE(is_temporary(".a.tmp-b.tmp-" + id));
  EXPECT_FALSE(is_temporary(".tmp-" + id));
  EXPECT_FALSE(is_temporary("step-1.tmp-" + id));
  EXPECT_FALSE(is_temporary(".bashrc.tmp-1234"));
  EXPECT_FALSE(is_temporary(".x.tmp-" + id + "0"));
  EXPECT_FALSE(is_temporary(".x.tmp-" + id.substr(0, 24) + "G"));
  // Readers skip more than writers remove: every ".tmp-" dot-directory.
  EXPECT_TRUE(looks_temporary(".bashrc.tmp-1234"));
  EXPECT_TRUE(looks_temporary(".step-1.tmp-" + id));
  EXPECT_FALSE(looks_temporary("step-1.tmp-" + id));
  EXPECT_FALSE(looks_temporary(".hidden"));
}

TEST(Layout, SnapshotNames) {
  for (const char* ok : {"a", "step-00000001", "final", "with space"}) {
    EXPECT_NO_THROW(check_snapshot_name(ok)) << ok;
  }
  const std::vector<std::string> bad_names = {
      "", ".", "..", ".hidden", "a/b", std::string(201, 'x'), std::string("a\0b", 3)};
  for (const std::string& bad : bad_names) {
    EXPECT_THROW(check_snapshot_name(bad), InvalidArgument) << bad;
  }
  try {
    check_snapshot_name(std::string(300, 'x'));
    ADD_FAILURE() << "a 300-byte name was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("300 bytes long, more than the 200"), std::string::npos)
        << e.what();
  }
}

// Ranks agree on a save by its name: the n-th save of a name has one id in a run, and ids
// differ across names, counts and runs.
TEST(Layout, GroupSaveIdsDependOnRunNameAndCount) {
  const std::string run = new_save_id(), other = new_save_id();
  const std::string id = group_save_id(run, "step-1", 0);
  EXPECT_EQ(id, group_save_id(run, "step-1", 0));
  EXPECT_TRUE(is_temporary(temporary_name("step-1", id))) << id;
  EXPECT_EQ(id.substr(0, 17), run.substr(0, 17));
  EXPECT_NE(id, group_save_id(run, "step-1", 1));
  EXPECT_NE(id, group_save_id(run, "step-2", 0));
  EXPECT_NE(id, group_save_id(other, "step-1", 0));
  EXPECT_THROW(group_save_id("not-an-id", "x", 0), InvalidArgument);
}

TEST(Layout, StepNamesRoundTripAndRejectOtherNames) {
  EXPECT_EQ(step_name(1200), "step-00001200");
  EXPECT_EQ(step_name(123456789012), "step-123456789012");
  EXPECT_EQ(parse_step_name("step-00001200"), 1200);
  EXPECT_EQ(parse_step_name("step-123456789012"), 123456789012);
  EXPECT_EQ(parse_step_name("step-00000000"), 0);
  for (const char* other : {"step-1200", "step-0000120a", "step-", "x-00001200", "final",
                            ".step-00001200.tmp-1", "step-000012000000000000000000"}) {
    EXPECT_FALSE(parse_step_name(other).has_value()) << other;
  }
}

TEST(Layout, StepOfMetadata) {
  EXPECT_EQ(step_of({{kStepKey, 42}}), 42);
  EXPECT_FALSE(step_of({{kStepKey, "42"}}).has_value());
  EXPECT_FALSE(step_of({{kStepKey, 4.5}}).has_value());
  EXPECT_FALSE(step_of(nlohmann::json::object()).has_value());
  EXPECT_FALSE(step_of(nlohmann::json::array()).has_value());
}

TEST(Layout, UtcTimestamp) {
  const std::chrono::system_clock::time_point t{std::chrono::milliseconds(1795975200123)};
  EXPECT_EQ(utc_timestamp(t), "2026-11-29T18:00:00.123Z");
  EXPECT_EQ(parse_utc_timestamp(utc_timestamp(t)), 1795975200);
  EXPECT_EQ(parse_utc_timestamp("2026-11-29T18:00:00Z"), 1795975200);
  EXPECT_FALSE(parse_utc_timestamp("2026-11-29T18:00:00.Z").has_value());
}

TEST(Layout, NewerOrdersByStepThenCreation) {
  EXPECT_TRUE(newer({5, 1}, {4, 9}));
  EXPECT_FALSE(newer({4, 9}, {5, 1}));
  EXPECT_TRUE(newer({4, 9}, {4, 1}));
  EXPECT_TRUE(newer({0, 1}, {std::nullopt, 9}));  // a step beats none
  EXPECT_FALSE(newer({std::nullopt, 9}, {0, 1}));
  EXPECT_TRUE(newer({std::nullopt, 9}, {std::nullopt, 1}));
  EXPECT_FALSE(newer({4, 1}, {4, 1}));
}

}  // namespace
}  // namespace tsnap::format
