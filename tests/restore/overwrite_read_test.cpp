// The overwrite guarantee for readers: while a writer overwrites a snapshot's name again and
// again, every load, load_into, open and verify sees the old snapshot or the new one in full,
// never a mix of the two and never an error.

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "restore/restore_util.h"
#include "tsnap/load.h"
#include "tsnap/reader.h"
#include "tsnap/save.h"

namespace tsnap {
namespace {

using test_support::TempDir;

StateDict state_of(uint64_t seed) {
  StateDict sd;
  // Several shards and chunks, so a read opens many files.
  for (int i = 0; i < 6; ++i) {
    sd.insert("t" + std::to_string(i), test_support::make_tensor(at::kFloat, {20000}, seed + i));
  }
  return sd;
}

TEST(OverwriteRead, ReadersSeeTheOldOrTheNewSnapshotNeverAMix) {
  TempDir dir;
  const auto path = dir / "s";
  const StateDict a = state_of(1);
  const StateDict b = state_of(100);
  SaveOptions o;
  o.overwrite = true;
  o.num_shards = 3;
  o.chunk_bytes = 16384;
  save(path, a, {}, o);

  std::atomic<bool> stop{false};
  std::string writer_error;
  std::thread writer([&] {
    try {
      for (int i = 0; i < 60 && !stop; ++i) save(path, i % 2 ? a : b, {}, o);
    } catch (const std::exception& e) {
      writer_error = e.what();
    }
    stop = true;
  });
  int reads = 0;
  std::string reader_error;
  try {
    while (!stop && reader_error.empty()) {
      const StateDict got = load(path);
      EXPECT_TRUE(test_support::same_state(got, a) || test_support::same_state(got, b));
      StateDict into = test_support::filled_like(a, 0);
      load_into(path, into);
      EXPECT_TRUE(test_support::same_state(into, a) || test_support::same_state(into, b));
      const SnapshotReader r = open(path);
      EXPECT_EQ(r.manifest().tensors.size(), 6u);
      const std::vector<BadChunk> bad = verify(path);
      if (!bad.empty()) reader_error = "verify: " + bad[0].file + ": " + bad[0].problem;
      ++reads;
    }
  } catch (const std::exception& e) {
    reader_error = e.what();
  }
  stop = true;
  writer.join();
  EXPECT_EQ(reader_error, "");
  EXPECT_EQ(writer_error, "");
  EXPECT_GT(reads, 0);
}

}  // namespace
}  // namespace tsnap
