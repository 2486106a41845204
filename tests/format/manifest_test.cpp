// Tests of MANIFEST.json (src/format/manifest_io.h, tsnap/manifest.h).

#include "tsnap/manifest.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "format/manifest_io.h"
#include "support/test_util.h"
#include "tsnap/error.h"

namespace tsnap::format {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The JSON of manifest_to_text(m) without its checksum member, which manifest_to_json lacks.
json text_json(const Manifest& m) {
  json j = json::parse(manifest_to_text(m));
  j.erase("checksum");
  return j;
}
using tsnap::test_support::TempDir;

constexpr const char* kLabel = "snapshots/step-100/MANIFEST.json";
constexpr const char* kShard0 = "shard-00000-of-00002.safetensors";
constexpr const char* kShard1 = "shard-00001-of-00002.safetensors";

/// Two shards: shard 0 holds "layer.bias" (F32 [5]) then "layer.weight" (BF16 [4, 5], saved
/// from F32, one rank's half of an [8, 5] tensor); shard 1 holds "step" (I64 scalar).
Manifest sample() {
  Manifest m;
  m.id = "20261129T180000-1a2b";
  m.tsnap_version = "0.1.0";
  m.torch_version = "1.13.1";
  m.created = "2026-11-29T18:00:00.123Z";
  m.created_unix_ns = 1795975200123000000;
  m.world_size = 2;
  m.metadata = {{"epoch", 3}, {"optimizer", {{"lr", 0.25}, {"betas", {0.9, 0.999}}}}};
  m.files = {
      {kShard0, 4156, 4096, 4096, {0x0123456789abcdefull, 0xffull}},
      {kShard1, 4104, 4096, 8192, {0xfedcba9876543210ull}},
  };
  m.tensors = {
      {"layer.bias", kShard0, at::kFloat, at::kFloat, {5}, 4096, 4116, std::nullopt},
      {"layer.weight",
       kShard0,
       at::kBFloat16,
       at::kFloat,
       {4, 5},
       4116,
       4156,
       ShardSpec{{8, 5}, {4, 0}}},
      {"step", kShard1, at::kLong, at::kLong, {}, 4096, 4104, std::nullopt},
  };
  return m;
}

void expect_same(const Manifest& a, const Manifest& b) {
  EXPECT_EQ(a.format_version, b.format_version);
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.tsnap_version, b.tsnap_version);
  EXPECT_EQ(a.torch_version, b.torch_version);
  EXPECT_EQ(a.created, b.created);
  EXPECT_EQ(a.created_unix_ns, b.created_unix_ns);
  EXPECT_EQ(a.world_size, b.world_size);
  EXPECT_EQ(a.metadata, b.metadata);
  ASSERT_EQ(a.files.size(), b.files.size());
  for (size_t i = 0; i < a.files.size(); ++i) {
    EXPECT_EQ(a.files[i].name, b.files[i].name);
    EXPECT_EQ(a.files[i].size, b.files[i].size);
    EXPECT_EQ(a.files[i].data_offset, b.files[i].data_offset);
    EXPECT_EQ(a.files[i].chunk_bytes, b.files[i].chunk_bytes);
    EXPECT_EQ(a.files[i].chunk_hashes, b.files[i].chunk_hashes);
  }
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const TensorRecord& x = a.tensors[i];
    const TensorRecord& y = b.tensors[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.file, y.file) << x.name;
    EXPECT_EQ(x.dtype, y.dtype) << x.name;
    EXPECT_EQ(x.source_dtype, y.source_dtype) << x.name;
    EXPECT_EQ(x.shape, y.shape) << x.name;
    EXPECT_EQ(x.begin, y.begin) << x.name;
    EXPECT_EQ(x.end, y.end) << x.name;
    EXPECT_EQ(x.shard, y.shard) << x.name;
  }
}

/// Expects the sample manifest, changed by `mutate`, to be rejected with `code` and a message
/// naming the manifest and containing `detail`.
void expect_rejected(const std::function<void(json&)>& mutate, ErrorCode code,
                     const std::string& detail = "") {
  json j = manifest_to_json(sample());
  mutate(j);
  try {
    parse_manifest(test_support::signed_manifest_text(j), kLabel);
    ADD_FAILURE() << "accepted a bad manifest; expected " << to_string(code);
  } catch (const FormatError& e) {
    EXPECT_EQ(e.code(), code) << "got " << to_string(e.code()) << ": " << e.what();
    const std::string what = e.what();
    EXPECT_NE(what.find(kLabel), std::string::npos) << what;
    EXPECT_NE(what.find(detail), std::string::npos) << "'" << detail << "' not in: " << what;
  }
}

void expect_text_rejected(const std::string& text, ErrorCode code) {
  try {
    parse_manifest(text, kLabel);
    ADD_FAILURE() << "accepted " << text;
  } catch (const FormatError& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(kLabel), std::string::npos) << e.what();
  }
}

TEST(Manifest, JsonLayout) {
  const json j = manifest_to_json(sample());
  EXPECT_EQ(j["format"], "tsnap");
  EXPECT_EQ(j["format_version"], kFormatVersion);
  EXPECT_EQ(j["id"], "20261129T180000-1a2b");
  EXPECT_EQ(j["created_unix_ns"], 1795975200123000000);
  EXPECT_EQ(j["world_size"], 2);
  EXPECT_EQ(j["metadata"]["optimizer"]["lr"], 0.25);
  const json& f = j["files"][kShard0];
  EXPECT_EQ(f["size"], 4156);
  EXPECT_EQ(f["data_offset"], 4096);
  EXPECT_EQ(f["chunk_bytes"], 4096);
  EXPECT_EQ(f["chunk_hashes"], json({"0123456789abcdef", "00000000000000ff"}));
  const json& w = j["tensors"]["layer.weight"];
  EXPECT_EQ(w["file"], kShard0);
  EXPECT_EQ(w["dtype"], "BF16");
  EXPECT_EQ(w["source_dtype"], "F32");
  EXPECT_EQ(w["shape"], json({4, 5}));
  EXPECT_EQ(w["offsets"], json({4116, 4156}));
  EXPECT_EQ(w["shard"], json({{"global_shape", {8, 5}}, {"offsets", {4, 0}}}));
  EXPECT_FALSE(j["tensors"]["layer.bias"].contains("shard"));
  EXPECT_EQ(j["tensors"]["step"]["shape"], json::array());
  EXPECT_EQ(j["weight_map"],
            json({{"layer.bias", kShard0}, {"layer.weight", kShard0}, {"step", kShard1}}));
}

TEST(Manifest, RoundTripsThroughJson) {
  const Manifest m = sample();
  expect_same(parse_manifest(test_support::signed_manifest_text(manifest_to_json(m)), kLabel), m);
  // Also with an empty snapshot.
  Manifest empty = sample();
  empty.files.clear();
  empty.tensors.clear();
  empty.metadata = json::object();
  expect_same(parse_manifest(test_support::signed_manifest_text(manifest_to_json(empty)), kLabel),
              empty);
}

// The manifest protects itself: a flip in any field (those no chunk hash covers included) is
// caught by its checksum; one without a checksum (an older writer's) is still read.
TEST(Manifest, ChecksumCatchesAFlipInAnyField) {
  const std::string text = manifest_to_text(sample());
  ASSERT_NE(text.find("\n\"checksum\":\"xxh3-64:"), std::string::npos) << text;
  expect_same(parse_manifest(text, kLabel), sample());
  for (const char* field : {"\"id\":\"2026", "\"created\":\"2026-11-29T18:00:00.1",
                            "\"torch_version\":\"1.", "\"lr\":0.2", "\"tsnap_version\":\"0."}) {
    const size_t at = text.find(field);
    ASSERT_NE(at, std::string::npos) << field;
    std::string flipped = text;
    flipped[at + std::string(field).size() - 1] ^= 0x01;  // a digit becomes another digit
    try {
      parse_manifest(flipped, kLabel);
      ADD_FAILURE() << "a flip in " << field << " was accepted";
    } catch (const FormatError& e) {
      EXPECT_EQ(e.code(), ErrorCode::kBadManifest) << e.what();
      EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
    }
  }
  std::string bad_value = text;
  bad_value.replace(bad_value.find("xxh3-64:"), 8, "xxh3-65:");
  expect_text_rejected(bad_value, ErrorCode::kBadManifest);
  // Without the member, a manifest of the current version is refused; one of an older version
  // (as older writers wrote it) reads.
  const size_t member = text.rfind(",\n\"checksum\"");
  expect_text_rejected(text.substr(0, member) + "}\n", ErrorCode::kBadManifest);
  json older = json::parse(text.substr(0, member) + "}\n");
  older["format_version"] = 2;
  Manifest expected = sample();
  expected.format_version = 2;
  expect_same(parse_manifest(older.dump(), kLabel), expected);
}

// One flip in the key name "checksum" must not turn the check off: a manifest of the current
// version must carry its checksum, and in an older one a last member shaped like a checksum
// under another name is an edit.
TEST(Manifest, AFlipInTheChecksumKeyIsCaught) {
  const std::string text = manifest_to_text(sample());
  const size_t key = text.rfind("\"checksum\"") + 1;
  json older_json = text_json(sample());
  older_json["format_version"] = 2;
  const std::string older = test_support::signed_manifest_text(older_json);
  const size_t older_key = older.rfind("\"checksum\"") + 1;
  for (size_t i = 0; i < 8; ++i) {
    for (unsigned char bit : {0x01, 0x20, 0x80}) {
      std::string flipped = text;
      flipped[key + i] = static_cast<char>(flipped[key + i] ^ bit);
      expect_text_rejected(flipped, ErrorCode::kBadManifest);
      std::string flipped_older = older;
      flipped_older[older_key + i] = static_cast<char>(flipped_older[older_key + i] ^ bit);
      expect_text_rejected(flipped_older, ErrorCode::kBadManifest);
    }
  }
}

// A writer may render the tensor records apart (while its chunks are written) and the rest at
// the commit: the same bytes as in one go, pieces included.
TEST(Manifest, TensorTextRenderedApartGivesTheSameText) {
  const Manifest m = sample();
  Manifest files_only = m;
  files_only.tensors.clear();
  const ManifestTensorText tensors = manifest_tensor_text(m);
  EXPECT_NE(tensors.tensors.find("\"layer.weight\""), std::string::npos) << tensors.tensors;
  EXPECT_EQ(manifest_to_text(files_only, &tensors), manifest_to_text(m));
  // The writer's checked text, with the records' bounds scanned apart or not, is the same.
  ManifestTensorText scanned = tensors;
  scan_bounds(scanned);
  EXPECT_EQ(readable_manifest_text(files_only, &scanned), manifest_to_text(m));
  EXPECT_EQ(readable_manifest_text(files_only, &tensors), manifest_to_text(m));
  EXPECT_EQ(readable_manifest_text(m), manifest_to_text(m));
}

// A file that keeps an earlier save's layout names that save (its header's id) and, when
// reused whole, the snapshot it came from (fields of version 2 on); the text and JSON writers
// agree.
TEST(Manifest, ReusedFilesRoundTrip) {
  Manifest m = sample();
  m.files[0].tsnap_id = "18ecf96338ad5d40-bee517c9";
  m.files[0].reused_from = "step-00000010";
  const json j = manifest_to_json(m);
  EXPECT_EQ(j["format_version"], kFormatVersion);
  EXPECT_EQ(j["files"][kShard0]["tsnap_id"], "18ecf96338ad5d40-bee517c9");
  EXPECT_EQ(j["files"][kShard0]["reused_from"], "step-00000010");
  EXPECT_EQ(text_json(m), j);
  const Manifest back = parse_manifest(manifest_to_text(m), kLabel);
  EXPECT_EQ(back.format_version, kFormatVersion);
  EXPECT_EQ(back.files[0].tsnap_id, m.files[0].tsnap_id);
  EXPECT_EQ(back.files[0].reused_from, m.files[0].reused_from);
  EXPECT_EQ(back.files[0].header_id(back.id), "18ecf96338ad5d40-bee517c9");
  EXPECT_EQ(back.files[1].header_id(back.id), back.id);
  expect_rejected([](json& j) { j["files"][kShard0]["tsnap_id"] = ""; }, ErrorCode::kBadManifest,
                  "\"tsnap_id\" is empty");
  expect_rejected([](json& j) { j["files"][kShard0]["tsnap_id"] = 7; }, ErrorCode::kBadManifest,
                  "tsnap_id");
}

TEST(Manifest, Lookups) {
  const Manifest m = sample();
  ASSERT_NE(m.find("layer.weight"), nullptr);
  EXPECT_EQ(m.find("layer.weight")->numel(), 20);
  EXPECT_EQ(m.find("layer.weight")->nbytes(), 40u);
  EXPECT_EQ(m.find("step")->numel(), 1);
  EXPECT_EQ(m.find("nope"), nullptr);
  ASSERT_NE(m.find_file(kShard1), nullptr);
  EXPECT_EQ(m.find_file(kShard1)->chunk_bytes, 8192u);
  EXPECT_EQ(m.find_file("nope"), nullptr);
  EXPECT_EQ(m.total_bytes(), 4156u + 4104u);
}

TEST(Manifest, ToJsonRejectsDuplicatesAndNonObjectMetadata) {
  Manifest m = sample();
  m.tensors.push_back(m.tensors.front());
  EXPECT_THROW(manifest_to_json(m), InvalidArgument);
  m = sample();
  m.files.push_back(m.files.front());
  EXPECT_THROW(manifest_to_json(m), InvalidArgument);
  m = sample();
  m.metadata = json::array();
  EXPECT_THROW(manifest_to_json(m), InvalidArgument);
}

TEST(Manifest, ReadsFromDirectory) {
  TempDir dir;
  std::ofstream(dir.path() / kManifestName) << manifest_to_text(sample());
  expect_same(read_manifest(dir.path()), sample());
}

TEST(Manifest, MissingManifestIsNotFound) {
  TempDir dir;
  try {
    read_manifest(dir.path());
    ADD_FAILURE() << "read a missing manifest";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find((dir.path() / kManifestName).string()), std::string::npos)
        << e.what();
  }
}

TEST(Manifest, ReadCapsTheSize) {
  TempDir dir;
  const fs::path path = dir.path() / kManifestName;
  std::ofstream(path).close();
  // A sparse file just over the cap: rejected from its size, never read.
  fs::resize_file(path, kMaxManifestBytes + 1);
  try {
    read_manifest(dir.path());
    ADD_FAILURE() << "read an oversized manifest";
  } catch (const FormatError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBadManifest);
    EXPECT_NE(std::string(e.what()).find("cap"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
  }
}

TEST(Manifest, ReadNamesTheFileInParseErrors) {
  TempDir dir;
  std::ofstream(dir.path() / kManifestName) << "{\"format\": \"tsnap\"";
  try {
    read_manifest(dir.path());
    ADD_FAILURE() << "read a truncated manifest";
  } catch (const FormatError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBadManifest);
    EXPECT_NE(std::string(e.what()).find((dir.path() / kManifestName).string()), std::string::npos)
        << e.what();
  }
}

TEST(Manifest, RejectsBadJson) {
  expect_text_rejected("", ErrorCode::kBadManifest);
  expect_text_rejected("{\"format\": ", ErrorCode::kBadManifest);
  expect_text_rejected("[]", ErrorCode::kBadManifest);
  expect_text_rejected("\"tsnap\"", ErrorCode::kBadManifest);
}

TEST(Manifest, RejectsUnsafeFileNames) {
  const std::vector<std::string> names = {
      "../x",         "a/b", "/etc/passwd", "", ".", "..", "..\\x", "a\\b", std::string("a\0b", 3),
      "shard/../../x"};
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    expect_rejected(
        [&](json& j) {
          j["files"][name] = j["files"][kShard1];
          j["files"].erase(kShard1);
          j["tensors"]["step"]["file"] = name;
          j["weight_map"]["step"] = name;
        },
        ErrorCode::kUnsafePath, "is not a plain name");
  }
}

TEST(Manifest, RejectsNewerFormatVersion) {
  expect_rejected([](json& j) { j["format_version"] = 4; }, ErrorCode::kUnsupportedFormat,
                  "written in format version 4; this tsnap reads format versions up to 3");
  // A newer version is reported as such even if the rest looks nothing like v1.
  expect_text_rejected(R"({"format": "tsnap", "format_version": 7, "shards": []})",
                       ErrorCode::kUnsupportedFormat);
  expect_rejected([](json& j) { j["format"] = "torchsnapshot"; }, ErrorCode::kUnsupportedFormat,
                  "\"torchsnapshot\"");
  expect_rejected([](json& j) { j["format_version"] = 0; }, ErrorCode::kBadManifest,
                  "format_version 0");
  expect_rejected([](json& j) { j["format_version"] = "1"; }, ErrorCode::kBadManifest,
                  "\"format_version\" is string");
}

TEST(Manifest, RejectsMissingOrMistypedFields) {
  for (const char* key :
       {"format", "id", "tsnap_version", "torch_version", "created", "created_unix_ns",
        "world_size", "metadata", "files", "tensors", "weight_map"}) {
    SCOPED_TRACE(key);
    expect_rejected([&](json& j) { j.erase(key); }, ErrorCode::kBadManifest,
                    std::string("has no \"") + key + "\"");
  }
  expect_rejected([](json& j) { j["id"] = ""; }, ErrorCode::kBadManifest, "\"id\" is empty");
  expect_rejected([](json& j) { j["world_size"] = "2"; }, ErrorCode::kBadManifest, "world_size");
  expect_rejected([](json& j) { j["world_size"] = 0; }, ErrorCode::kBadManifest, "world_size");
  expect_rejected([](json& j) { j["created_unix_ns"] = 1.5; }, ErrorCode::kBadManifest,
                  "created_unix_ns");
  for (const char* bad :
       {"yesterday", "2026-11-29 18:00:00Z", "2026-11-29T18:00:00", "2026-13-29T18:00:00Z",
        "2026-11-29T18:00:00.Z", "2026-11-29T18:00:00.123Zjunk", "1969-12-31T23:59:59Z"}) {
    SCOPED_TRACE(bad);
    expect_rejected([&](json& j) { j["created"] = bad; }, ErrorCode::kBadManifest,
                    "not an ISO 8601 UTC time");
  }
  // Both times must name the same second.
  expect_rejected([](json& j) { j["created"] = "2026-11-29T18:00:01.123Z"; },
                  ErrorCode::kBadManifest, "name different times");
  expect_rejected([](json& j) { j["created_unix_ns"] = -5; }, ErrorCode::kBadManifest,
                  "name different times");
  expect_rejected([](json& j) { j["metadata"] = json::array(); }, ErrorCode::kBadManifest,
                  "\"metadata\" is array");
  expect_rejected([](json& j) { j["files"][kShard0]["size"] = -1; }, ErrorCode::kBadManifest,
                  "\"size\"");
  expect_rejected([](json& j) { j["tensors"]["step"]["shape"] = {-1}; }, ErrorCode::kBadManifest,
                  "\"shape\"[0]");
  expect_rejected([](json& j) { j["tensors"]["step"]["dtype"] = "C64"; }, ErrorCode::kBadManifest,
                  "unknown dtype \"C64\"");
  expect_rejected([](json& j) { j["tensors"]["step"]["offsets"] = {4096}; },
                  ErrorCode::kBadManifest, "\"offsets\" needs 2 values");
  expect_rejected([](json& j) { j["tensors"]["step"].erase("source_dtype"); },
                  ErrorCode::kBadManifest, "tensor 'step' has no \"source_dtype\"");
}

TEST(Manifest, RejectsChunkHashMismatch) {
  expect_rejected([](json& j) { j["files"][kShard0]["chunk_hashes"].erase(1); },
                  ErrorCode::kBadManifest, "has 1 chunk hashes, expected 2");
  expect_rejected(
      [](json& j) { j["files"][kShard1]["chunk_hashes"].push_back("0000000000000000"); },
      ErrorCode::kBadManifest, "expected 1");
  expect_rejected([](json& j) { j["files"][kShard0]["chunk_hashes"][0] = "0123456789ABCDEF"; },
                  ErrorCode::kBadManifest, "16 lowercase hex digits");
  expect_rejected([](json& j) { j["files"][kShard0]["chunk_hashes"][0] = "123"; },
                  ErrorCode::kBadManifest, "16 lowercase hex digits");
  expect_rejected([](json& j) { j["files"][kShard0]["chunk_hashes"][0] = 12; },
                  ErrorCode::kBadManifest, "16 lowercase hex digits");
}

TEST(Manifest, RejectsBadChunkSizeAndDataOffset) {
  expect_rejected([](json& j) { j["files"][kShard0]["chunk_bytes"] = 0; }, ErrorCode::kBadManifest,
                  "chunk_bytes 0");
  expect_rejected([](json& j) { j["files"][kShard0]["chunk_bytes"] = 1000; },
                  ErrorCode::kBadManifest, "chunk_bytes 1000");
  expect_rejected([](json& j) { j["files"][kShard0]["data_offset"] = 100; },
                  ErrorCode::kBadManifest, "data_offset 100");
  expect_rejected([](json& j) { j["files"][kShard0]["data_offset"] = 8192; },
                  ErrorCode::kBadManifest, "data_offset 8192");
}

TEST(Manifest, RejectsTensorInUnlistedFile) {
  expect_rejected(
      [](json& j) {
        j["tensors"]["step"]["file"] = "shard-00009.safetensors";
        j["weight_map"]["step"] = "shard-00009.safetensors";
      },
      ErrorCode::kBadManifest, "tensor 'step' is in file 'shard-00009.safetensors'");
}

TEST(Manifest, RejectsOffsetsOutsideTheData) {
  expect_rejected(
      [](json& j) {
        j["tensors"]["step"]["offsets"] = {4088, 4096};
      },
      ErrorCode::kBadOffsets, "tensor 'step': offsets [4088, 4096) lie outside");
  expect_rejected(
      [](json& j) {
        j["tensors"]["step"]["offsets"] = {4100, 4108};
      },
      ErrorCode::kBadOffsets, "[4096, 4104)");
  expect_rejected(
      [](json& j) {
        j["tensors"]["step"]["offsets"] = {4104, 4096};
      },
      ErrorCode::kBadOffsets, "[4104, 4096)");
}

TEST(Manifest, RejectsShapeByteMismatchAndOverflow) {
  expect_rejected(
      [](json& j) {
        j["tensors"]["layer.weight"]["shape"] = {5, 5};
      },
      ErrorCode::kBadOffsets, "need 50 bytes but offsets [4116, 4156) hold 40");
  expect_rejected(
      [](json& j) {
        j["tensors"]["layer.weight"]["shape"] = {int64_t{1} << 62, 8};
        j["tensors"]["layer.weight"].erase("shard");
      },
      ErrorCode::kBadOffsets, "overflows");
}

TEST(Manifest, RejectsOverlappingTensors) {
  expect_rejected(
      [](json& j) {
        j["tensors"]["layer.weight"]["offsets"] = {4110, 4150};
      },
      ErrorCode::kBadOffsets, "tensors 'layer.bias' and 'layer.weight' overlap");
}

TEST(Manifest, RejectsInconsistentWeightMap) {
  expect_rejected([](json& j) { j["weight_map"]["step"] = kShard0; }, ErrorCode::kBadManifest,
                  "weight_map does not map tensor 'step'");
  expect_rejected([](json& j) { j["weight_map"].erase("layer.bias"); }, ErrorCode::kBadManifest,
                  "'layer.bias'");
  expect_rejected([](json& j) { j["weight_map"]["ghost"] = kShard0; }, ErrorCode::kBadManifest,
                  "weight_map names 'ghost'");
}

TEST(Manifest, RejectsCastIntegerTensors) {
  expect_rejected([](json& j) { j["tensors"]["step"]["source_dtype"] = "F64"; },
                  ErrorCode::kBadManifest, "F64 was stored as I64");
}

TEST(Manifest, RejectsShardOutsideGlobalShape) {
  expect_rejected(
      [](json& j) {
        j["tensors"]["layer.weight"]["shard"]["offsets"] = {5, 0};
      },
      ErrorCode::kBadManifest, "shard does not lie inside");
  expect_rejected([](json& j) { j["tensors"]["layer.weight"]["shard"]["global_shape"] = {8}; },
                  ErrorCode::kBadManifest, "shard does not lie inside");
  expect_rejected(
      [](json& j) {
        j["tensors"]["layer.weight"]["shard"]["offsets"] = {INT64_MAX, 0};
        j["tensors"]["layer.weight"]["shard"]["global_shape"] = {INT64_MAX, 5};
      },
      ErrorCode::kBadManifest, "shard does not lie inside");
}

/// The sample with "layer.weight"'s other half ([0, 4) of the [8, 5] tensor) written by rank 1
/// in a third file: one key stored as two pieces.
Manifest pieced() {
  Manifest m = sample();
  m.files.push_back({"rank-00001-shard-00000-of-00001.safetensors", 4136, 4096, 8192, {0x1ull}, 1});
  m.tensors.push_back({"layer.weight",
                       m.files.back().name,
                       at::kBFloat16,
                       at::kFloat,
                       {4, 5},
                       4096,
                       4136,
                       ShardSpec{{8, 5}, {0, 0}}});
  return m;
}

TEST(Manifest, KeyStoredAsPiecesRoundTrips) {
  const Manifest m = pieced();
  const json j = manifest_to_json(m);
  ASSERT_TRUE(j["tensors"]["layer.weight"].contains("pieces"));
  EXPECT_EQ(j["tensors"]["layer.weight"]["pieces"].size(), 2u);
  EXPECT_FALSE(j["weight_map"].contains("layer.weight"));  // no one file holds it
  EXPECT_EQ(j["files"]["rank-00001-shard-00000-of-00001.safetensors"]["rank"], 1);
  EXPECT_EQ(text_json(m), j);
  const Manifest back = parse_manifest(manifest_to_text(m), kLabel);
  const auto pieces = back.pieces("layer.weight");
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0]->shard->offsets, (std::vector<int64_t>{0, 0}));  // offsets order
  EXPECT_EQ(pieces[1]->shard->offsets, (std::vector<int64_t>{4, 0}));
  EXPECT_EQ(back.find_file("rank-00001-shard-00000-of-00001.safetensors")->rank, 1);
}

TEST(Manifest, RejectsPiecesThatDoNotFit) {
  const auto rejected = [](const std::function<void(json&)>& mutate, ErrorCode code,
                           const std::string& detail) {
    json j = manifest_to_json(pieced());
    mutate(j["tensors"]["layer.weight"]["pieces"]);
    try {
      parse_manifest(test_support::signed_manifest_text(j), kLabel);
      ADD_FAILURE() << "accepted pieces that do not fit: " << detail;
    } catch (const FormatError& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(detail), std::string::npos) << e.what();
    }
  };
  rejected(
      [](json& p) {
        p[0]["shard"]["offsets"] = {2, 0};
      },
      ErrorCode::kBadOffsets, "share elements");
  rejected(
      [](json& p) {
        p[0]["shard"]["global_shape"] = {9, 5};
      },
      ErrorCode::kBadManifest, "disagree on the global shape");
  rejected([](json& p) { p[0].erase("shard"); }, ErrorCode::kBadManifest, "has no \"shard\"");
  rejected([](json& p) { p = json::array(); }, ErrorCode::kBadManifest, "non-empty array");
  // Two records of one key without shards cannot be written either.
  Manifest m = sample();
  m.tensors.push_back(m.tensors[0]);
  EXPECT_THROW(manifest_to_text(m), InvalidArgument);
}

}  // namespace
}  // namespace tsnap::format
