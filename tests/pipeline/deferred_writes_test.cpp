// Writes held back while a save stages (pipeline/deferred_writes.h): one save at a time holds
// them, its own release runs them, and a release by anyone else (a wait for a staging buffer)
// runs them at once and makes the save write the rest as it stages.

#include "pipeline/deferred_writes.h"

#include <gtest/gtest.h>

#include <vector>

namespace tsnap::pipeline {
namespace {

TEST(DeferredWrites, OneSaveAtATimeHoldsWritesUntilItReleasesThem) {
  DeferredWrites deferred;
  std::vector<int> ran;
  const uint64_t a = deferred.begin();
  ASSERT_NE(a, 0u);
  EXPECT_EQ(deferred.begin(), 0u);  // another save writes as it stages
  EXPECT_TRUE(deferred.hold(a, [&] { ran.push_back(1); }));
  EXPECT_TRUE(deferred.hold(a, [&] { ran.push_back(2); }));
  EXPECT_FALSE(deferred.hold(0, [&] { ran.push_back(9); }));  // no ticket: write now
  EXPECT_TRUE(ran.empty());
  deferred.release(a);
  EXPECT_EQ(ran, (std::vector<int>{1, 2}));
  deferred.release(a);  // once only
  EXPECT_EQ(ran.size(), 2u);
  EXPECT_NE(deferred.begin(), 0u);  // free for the next save
}

TEST(DeferredWrites, AWaitForABufferReleasesWhateverIsHeld) {
  DeferredWrites deferred;
  std::vector<int> ran;
  deferred.release_any();  // nothing held: a no-op
  const uint64_t a = deferred.begin();
  EXPECT_TRUE(deferred.hold(a, [&] { ran.push_back(1); }));
  deferred.release_any();
  EXPECT_EQ(ran, (std::vector<int>{1}));
  // The save's later chunks are written as staged, and its own release finds nothing.
  EXPECT_FALSE(deferred.hold(a, [&] { ran.push_back(2); }));
  // Its ticket no longer names the writes another save holds back since.
  const uint64_t b = deferred.begin();
  ASSERT_NE(b, 0u);
  EXPECT_NE(b, a);
  EXPECT_TRUE(deferred.hold(b, [&] { ran.push_back(3); }));
  deferred.release(a);
  EXPECT_EQ(ran, (std::vector<int>{1}));
  deferred.release(b);
  EXPECT_EQ(ran, (std::vector<int>{1, 3}));
}

}  // namespace
}  // namespace tsnap::pipeline
