#pragma once
// One conformance suite for every kind of snapshot root: a test program instantiates
// StorageRootSuite (the read side, format/storage_root.h) and DurableStoreSuite (the write
// side, pipeline/durable_store.h) with a backend for its kind (a directory, an S3 prefix), and
// the same tests check that each gives the same answers. The snapshots are put there as users
// put them: saved to a local root and drained into the root under test.
//
//   INSTANTIATE_TEST_SUITE_P(Directory, StorageRootSuite,
//                            ::testing::Values(std::make_shared<DirBackend>()));

#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "format/manifest_io.h"
#include "format/open_file.h"
#include "format/storage_root.h"
#include "io/engine.h"
#include "pipeline/durable_store.h"
#include "support/test_util.h"
#include "tsnap/error.h"
#include "tsnap/manifest.h"
#include "tsnap/snapshotter.h"

namespace tsnap::test_support {

/// A kind of root.
class StorageRootBackend {
 public:
  virtual ~StorageRootBackend() = default;
  /// A fresh, empty root ("" when the kind is not available here: the tests skip).
  virtual std::string fresh_root() = 0;
  /// Why the kind is not available.
  virtual std::string why() const { return ""; }
  /// Leaves what an interrupted writer leaves of snapshot `name` under `root`: a file of it, no
  /// manifest.
  virtual void make_partial(const std::string& root, const std::string& name) = 0;
  /// For test names.
  virtual std::string kind() const = 0;
};

class StorageRootSuite : public ::testing::TestWithParam<std::shared_ptr<StorageRootBackend>> {
 protected:
  void SetUp() override {
    location_ = GetParam()->fresh_root();
    if (location_.empty()) GTEST_SKIP() << GetParam()->why();
    SnapshotterOptions o;
    o.root = local_.path();
    o.chunk_bytes = 64 << 10;
    o.staging.budget_bytes = 4 << 20;
    o.tier.durable_root = location_;
    o.tier.local_keep_last = 0;
    Snapshotter snap(o);
    for (const char* name : {"a", "b"}) {
      StateDict sd;
      sd.insert("w", make_tensor(at::kFloat, {100000}, name[0]));  // 400 KB: 7 chunks
      sd.insert("v", make_tensor(at::kLong, {3}, 7));
      snap.save_async(name, sd).wait();
    }
    snap.drain_wait();
    root_ = format::StorageRoot::open(location_);
  }

  std::string local_text(const std::string& name, const std::string& file) const {
    std::ifstream in(local_ / name / file, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  TempDir local_;
  std::string location_;
  std::unique_ptr<format::StorageRoot> root_;
};

TEST_P(StorageRootSuite, ListsCommittedSnapshotsOldestFirstWithTheirManifests) {
  const std::vector<Listed> listed = root_->list();
  ASSERT_EQ(listed.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const std::string name = i == 0 ? "a" : "b";
    EXPECT_EQ(listed[i].name, name);
    EXPECT_TRUE(listed[i].committed) << listed[i].problem;
    EXPECT_FALSE(listed[i].temporary);
    ASSERT_TRUE(listed[i].manifest.has_value());
    EXPECT_EQ(listed[i].manifest->id, read_manifest(local_ / name).id);
    EXPECT_EQ(listed[i].path, root_->locate(name));
  }
}

TEST_P(StorageRootSuite, GivesTheManifestsExactBytesAndNothingForAMissingOne) {
  EXPECT_EQ(root_->manifest_text("b"), local_text("b", kManifestName));
  EXPECT_EQ(root_->read_manifest("b").id, read_manifest(local_ / "b").id);
  EXPECT_FALSE(root_->manifest_text("nothing").has_value());
  try {
    (void)root_->read_manifest("nothing");
    ADD_FAILURE() << "read_manifest of a missing snapshot returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound) << e.what();
    EXPECT_NE(std::string(e.what()).find("nothing"), std::string::npos) << e.what();
  }
}

TEST_P(StorageRootSuite, ListsEachFileWithItsSize) {
  const Manifest m = read_manifest(local_ / "b");
  std::map<std::string, uint64_t> want{{kManifestName, local_text("b", kManifestName).size()}};
  for (const FileRecord& f : m.files) want.emplace(f.name, f.size);
  EXPECT_EQ(root_->file_sizes("b"), want);
  EXPECT_TRUE(root_->file_sizes("nothing").empty());
}

TEST_P(StorageRootSuite, ReadsByteRangesAndNamesWhatIsMissingOrShort) {
  const Manifest m = read_manifest(local_ / "b");
  const FileRecord& f = m.files.at(0);
  const std::string bytes = local_text("b", f.name);
  ASSERT_EQ(bytes.size(), f.size);
  for (const auto& [offset, n] : std::vector<std::pair<uint64_t, size_t>>{
           {0, 100}, {f.size / 2, 70001}, {f.size - 1, 1}, {0, f.size}, {5, 0}}) {
    std::string got(n, '\0');
    root_->read("b", f.name, offset, got.data(), n);
    EXPECT_EQ(got, bytes.substr(offset, n)) << offset << "+" << n;
  }
  std::string buffer(16, '\0');
  try {
    root_->read("b", f.name, f.size - 8, buffer.data(), 16);
    ADD_FAILURE() << "a read past the end returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTruncated) << e.what();
  }
  try {
    root_->read("b", "no-such-file", 0, buffer.data(), 1);
    ADD_FAILURE() << "a read of a missing file returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound) << e.what();
  }
}

TEST_P(StorageRootSuite, ListsAnInterruptedWriteAsNotCommitted) {
  GetParam()->make_partial(location_, "c");
  bool seen = false;
  for (const Listed& l : root_->list()) {
    if (l.name != "c") continue;
    seen = true;
    EXPECT_FALSE(l.committed);
    EXPECT_FALSE(l.manifest.has_value());
  }
  EXPECT_TRUE(seen);
  EXPECT_FALSE(root_->manifest_text("c").has_value());
}

TEST_P(StorageRootSuite, RemovesASnapshotByUnlistingItFirst) {
  int calls = 0;
  const std::filesystem::path at = root_->remove("a", [&](const std::filesystem::path& where) {
    ++calls;
    // From here on the snapshot is not committed under its name.
    EXPECT_FALSE(root_->manifest_text("a").has_value()) << where;
  });
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(at.empty());
  const std::vector<Listed> listed = root_->list();
  for (const Listed& l : listed) EXPECT_NE(l.name, "a");
  EXPECT_TRUE(root_->file_sizes("a").empty());
  EXPECT_TRUE(root_->manifest_text("b").has_value());
  try {
    (void)root_->remove("a");
    ADD_FAILURE() << "a second removal returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound) << e.what();
  }
}

TEST_P(StorageRootSuite, OpensTheRootOfASnapshotFromItsLocation) {
  const auto [root, name] = format::StorageRoot::of_snapshot(root_->locate("b"));
  EXPECT_EQ(name, "b");
  EXPECT_EQ(root->locate("b"), root_->locate("b"));
  EXPECT_EQ(root->read_manifest(name).id, read_manifest(local_ / "b").id);
  EXPECT_EQ(read_manifest(root_->locate("b")).id, read_manifest(local_ / "b").id);
}

// The write side: what the drain writes through, on the same roots.
class DurableStoreSuite : public StorageRootSuite {
 protected:
  void SetUp() override {
    StorageRootSuite::SetUp();
    if (IsSkipped()) return;
    SnapshotterOptions o;
    o.root = local_ / "more";
    o.chunk_bytes = 64 << 10;
    o.staging.budget_bytes = 4 << 20;
    Snapshotter snap(o);
    StateDict sd;
    sd.insert("w", make_tensor(at::kFloat, {100000}, 'c'));
    sd.insert("v", make_tensor(at::kLong, {3}, 9));
    snap.save_async("c", sd).wait();
    manifest_ = read_manifest(local_ / "more" / "c");
    text_ = local_text("more/c", kManifestName);
  }

  // The store of the root under test, as rank `node_rank` of a group (-1: alone).
  std::unique_ptr<pipeline::DurableStore> store(int node_rank = -1) const {
    pipeline::DurableConfig config;
    config.root = location_;
    config.engine = io::make_pwrite_engine(1, /*background=*/false);
    config.pace = [](uint64_t) {};
    config.node_rank = node_rank;
    return pipeline::DurableStore::open(std::move(config));
  }

  // Writes every file of the local snapshot `from` (under local_) with manifest `m`.
  void write_all(pipeline::DurableSave& save, const std::string& from, const Manifest& m,
                 DrainRecord& record) const {
    const format::SnapshotDir dir = format::SnapshotDir::open(local_ / from);
    for (const FileRecord& f : m.files) {
      const format::OpenedFile src = format::open_snapshot_file(dir, f.name, "shard");
      save.write(pipeline::CheckedSource(src, dir.label(f.name), f, save.where(f)), record);
    }
  }

  bool committed(const std::string& name) const {
    for (const Listed& l : root_->list()) {
      if (l.name == name) return l.committed;
    }
    return false;
  }

  Manifest manifest_;
  std::string text_;
};

TEST_P(DurableStoreSuite, PublishesASaveLastAndOnlyOnceEveryFileIsWritten) {
  const auto s = store();
  EXPECT_FALSE(s->settled("c", manifest_));
  DrainRecord record;
  {
    const auto save = s->begin("c", manifest_, /*shared=*/false);
    write_all(*save, "more/c", manifest_, record);
    EXPECT_FALSE(committed("c"));
    EXPECT_FALSE(root_->manifest_text("c").has_value());
    EXPECT_TRUE(save->publish(text_, record));
  }
  EXPECT_TRUE(committed("c"));
  EXPECT_EQ(root_->manifest_text("c"), text_);
  uint64_t bytes = text_.size();
  for (const FileRecord& f : manifest_.files) {
    std::string got(f.size, '\0');
    root_->read("c", f.name, 0, got.data(), f.size);
    EXPECT_EQ(got, local_text("more/c", f.name)) << f.name;
    bytes += f.size;
  }
  EXPECT_EQ(record.bytes, bytes);
  EXPECT_TRUE(s->settled("c", manifest_));
  // A newer save of the name there settles an older one too.
  EXPECT_TRUE(s->settled("b", read_manifest(local_ / "a")));
}

TEST_P(DurableStoreSuite, RefusesAChunkThatDoesNotMatchItsHashAndPublishesNothing) {
  std::filesystem::copy(local_ / "more" / "c", local_ / "more" / "d");
  const FileRecord& f = manifest_.files.at(0);
  {
    std::fstream out(local_ / "more" / "d" / f.name,
                     std::ios::binary | std::ios::in | std::ios::out);
    out.seekp(static_cast<std::streamoff>(f.size - 10));
    out.put('\x5a');
  }
  const auto s = store();
  {
    const auto save = s->begin("d", manifest_, /*shared=*/false);
    DrainRecord record;
    try {
      write_all(*save, "more/d", manifest_, record);
      ADD_FAILURE() << "a corrupt chunk was written";
    } catch (const FormatError& e) {
      EXPECT_EQ(e.code(), ErrorCode::kHashMismatch) << e.what();
      EXPECT_NE(std::string(e.what()).find("chunk " + std::to_string(f.chunk_hashes.size() - 1)),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(f.name), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(committed("d"));
  EXPECT_FALSE(root_->manifest_text("d").has_value());
}

TEST_P(DurableStoreSuite, PublishesASharedSaveByTheRankThatCompletesIt) {
  const auto s0 = store(0);
  const auto s1 = store(1);
  const auto save0 = s0->begin("c", manifest_, /*shared=*/true);
  const auto save1 = s1->begin("c", manifest_, /*shared=*/true);
  DrainRecord record0, record1;
  EXPECT_TRUE(save0->in_place().empty());
  EXPECT_FALSE(save0->publish(text_, record0));  // nothing written yet
  EXPECT_FALSE(committed("c"));
  write_all(*save1, "more/c", manifest_, record1);
  EXPECT_EQ(save0->in_place().size(), manifest_.files.size());
  EXPECT_TRUE(save0->has(manifest_.files.at(0)));
  EXPECT_FALSE(committed("c"));
  EXPECT_TRUE(save1->publish(text_, record1));
  EXPECT_TRUE(committed("c"));
  EXPECT_EQ(root_->manifest_text("c"), text_);
  EXPECT_FALSE(save0->publish(text_, record0));  // published by the other rank
  EXPECT_TRUE(s0->settled("c", manifest_));
}

}  // namespace tsnap::test_support
