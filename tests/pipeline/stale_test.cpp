// A stale snapshot is noticed: each save compares the hashes of its tensors' bytes with the
// previous snapshot of the same Snapshotter, records which are unchanged and the step it holds,
// and flags (or refuses) a save whose optimizer moments did not change while the step advanced.
// The stale source is injected as trainers got it wrong: moments saved from copies that no
// longer update.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "tsnap/error.h"
#include "tsnap/load.h"
#include "tsnap/manifest.h"
#include "tsnap/snapshotter.h"

namespace tsnap {
namespace {

namespace fs = std::filesystem;
using test_support::make_tensor;
using test_support::TempDir;

SnapshotterOptions options_for(const fs::path& root) {
  SnapshotterOptions o;
  o.root = root;
  o.chunk_bytes = 64 << 10;
  o.staging.budget_bytes = 4 << 20;
  return o;
}

// A training state at `step`: weights and Adam moments that change every step, a frozen
// embedding that never does, and a step counter. With `stale_from`, the moments are the
// values of that step whatever `step` is (a cached copy that stopped updating).
StateDict training_state(int step, int stale_from = 0) {
  const int moments_step = stale_from > 0 ? stale_from : step;
  StateDict sd;
  sd.insert("model/w", make_tensor(at::kFloat, {128, 64}, 100 + step));
  sd.insert("model/frozen", make_tensor(at::kFloat, {256, 64}, 7));
  sd.insert("optim/w/exp_avg", make_tensor(at::kFloat, {128, 64}, 200 + moments_step));
  sd.insert("optim/w/exp_avg_sq", make_tensor(at::kFloat, {128, 64}, 300 + moments_step));
  sd.insert("optim/w/step", at::full({}, static_cast<float>(step)));
  return sd;
}

SaveOptions at_step(int step, bool fail = false) {
  SaveOptions o;
  o.step = step;
  o.stale.must_change = optimizer_moment_keys();
  o.stale.fail = fail;
  return o;
}

std::string name_of(int step) { return "s" + std::to_string(step); }

SaveStats save_at(Snapshotter& snap, int step, const StateDict& state, bool fail = false) {
  SaveHandle h =
      snap.save_async(name_of(step), state, nlohmann::json::object(), at_step(step, fail));
  h.wait();
  return h.stats();
}

TEST(Stale, EachSaveRecordsItsStepAndTheTensorsUnchangedSinceThePreviousOne) {
  TempDir dir;
  Snapshotter snap(options_for(dir.path()));
  const SaveStats first = save_at(snap, 1, training_state(1));
  EXPECT_TRUE(first.unchanged_since.empty());
  EXPECT_EQ(first.unchanged_tensors, 0u);
  const Manifest m1 = read_manifest(dir / "s1");
  EXPECT_EQ(m1.step, 1);
  EXPECT_TRUE(m1.unchanged_since.empty());

  const SaveStats second = save_at(snap, 2, training_state(2));
  EXPECT_EQ(second.unchanged_since, "s1");
  EXPECT_EQ(second.unchanged_tensors, 1u);  // the frozen embedding
  EXPECT_TRUE(second.stale.empty());
  const Manifest m2 = read_manifest(dir / "s2");
  EXPECT_EQ(m2.step, 2);
  EXPECT_EQ(m2.unchanged_since, "s1");
  EXPECT_EQ(m2.unchanged, std::vector<std::string>{"model/frozen"});
}

TEST(Stale, MomentsThatStoppedUpdatingAreReportedWhileTheStepAdvances) {
  TempDir dir;
  Snapshotter snap(options_for(dir.path()));
  save_at(snap, 1, training_state(1));
  save_at(snap, 2, training_state(2));
  const SaveStats stale = save_at(snap, 3, training_state(3, /*stale_from=*/2));
  EXPECT_EQ(stale.stale, (std::vector<std::string>{"optim/w/exp_avg", "optim/w/exp_avg_sq"}));
  EXPECT_EQ(stale.unchanged_tensors, 3u);
  const Manifest m3 = read_manifest(dir / "s3");
  EXPECT_EQ(m3.unchanged,
            (std::vector<std::string>{"model/frozen", "optim/w/exp_avg", "optim/w/exp_avg_sq"}));
}

TEST(Stale, WithFailAStaleSaveCommitsNothingAndNamesTheTensors) {
  TempDir dir;
  Snapshotter snap(options_for(dir.path()));
  save_at(snap, 1, training_state(1));
  try {
    save_at(snap, 2, training_state(2, /*stale_from=*/1), /*fail=*/true);
    ADD_FAILURE() << "a stale save committed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kStale) << e.what();
    const std::string what = e.what();
    EXPECT_NE(what.find("optim/w/exp_avg"), std::string::npos) << what;
    EXPECT_NE(what.find("s1 (step 1)"), std::string::npos) << what;
  }
  EXPECT_FALSE(fs::exists(dir / "s2"));
  // A fresh state saves (compared with s1, the last committed).
  EXPECT_TRUE(save_at(snap, 2, training_state(2), /*fail=*/true).stale.empty());
}

TEST(Stale, NoCheckWithoutAnAdvancingStep) {
  TempDir dir;
  Snapshotter snap(options_for(dir.path()));
  save_at(snap, 5, training_state(5));
  // The same step again (a final save after a periodic one): nothing is stale.
  SaveHandle h = snap.save_async("again", training_state(5), nlohmann::json::object(),
                                 at_step(5, /*fail=*/true));
  h.wait();
  EXPECT_TRUE(h.stats().stale.empty());
  EXPECT_EQ(h.stats().unchanged_tensors, 5u);
  // No step given: counted, not checked.
  SaveOptions o;
  o.stale.must_change = optimizer_moment_keys();
  o.stale.fail = true;
  SaveHandle h2 = snap.save_async("nostep", training_state(5), nlohmann::json::object(), o);
  h2.wait();
  EXPECT_EQ(h2.stats().unchanged_tensors, 5u);
  EXPECT_FALSE(read_manifest(dir / "nostep").step.has_value());
}

TEST(Stale, AMalformedPatternIsRefusedAtTheCall) {
  TempDir dir;
  Snapshotter snap(options_for(dir.path()));
  SaveOptions o;
  o.stale.must_change = {"optim/[w"};
  EXPECT_THROW(snap.save_async("s", training_state(1), nlohmann::json::object(), o),
               InvalidArgument);
}

}  // namespace
}  // namespace tsnap
