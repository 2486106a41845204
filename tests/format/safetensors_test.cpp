// Tests of the safetensors shard header (src/format/safetensors.h) and the dtype table.

#include "format/safetensors.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "format/dtype.h"
#include "support/test_util.h"
#include "tsnap/error.h"

namespace tsnap::format {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tsnap::test_support::TempDir;

constexpr const char* kFile = "shard-00000-of-00001.safetensors";

HeaderTensor tensor(std::string name, at::ScalarType dtype, std::vector<int64_t> shape) {
  return HeaderTensor{std::move(name), dtype, std::move(shape), 0, 0};
}

/// Orders tensors as tsnap does (element size descending, then name) and lays them out back to
/// back from offset 0.
std::vector<HeaderTensor> lay_out(std::vector<HeaderTensor> ts) {
  std::sort(ts.begin(), ts.end(), [](const HeaderTensor& a, const HeaderTensor& b) {
    const size_t ea = element_size(a.dtype), eb = element_size(b.dtype);
    return ea != eb ? ea > eb : a.name < b.name;
  });
  uint64_t offset = 0;
  for (auto& t : ts) {
    t.begin = offset;
    offset += checked_nbytes(t.dtype, t.shape).value();
    t.end = offset;
  }
  return ts;
}

/// A data section for `ts`: byte i of the section is (i * 7 + 3) mod 251.
std::string data_for(const std::vector<HeaderTensor>& ts) {
  std::string data(ts.empty() ? 0 : ts.back().end, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 7 + 3) % 251);
  return data;
}

std::string le64(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

/// A file image with `header` as its JSON (unpadded) and `data_len` data bytes.
std::string image(const std::string& header, uint64_t data_len) {
  return le64(header.size()) + header + std::string(data_len, 'x');
}

std::string image(const json& header, uint64_t data_len) { return image(header.dump(), data_len); }

/// Expects parse_header to throw a FormatError with `code` whose message names kFile and
/// contains `detail`.
void expect_rejected(const std::string& bytes, ErrorCode code, const std::string& detail = "",
                     uint64_t file_size = UINT64_MAX) {
  if (file_size == UINT64_MAX) file_size = bytes.size();
  try {
    parse_header(kFile, bytes, file_size);
    ADD_FAILURE() << "accepted a bad header; expected " << to_string(code);
  } catch (const FormatError& e) {
    EXPECT_EQ(e.code(), code) << "got " << to_string(e.code()) << ": " << e.what();
    const std::string what = e.what();
    EXPECT_NE(what.find(kFile), std::string::npos) << what;
    EXPECT_NE(what.find(detail), std::string::npos) << "'" << detail << "' not in: " << what;
  }
}

json entry(const char* dtype, json shape, uint64_t begin, uint64_t end) {
  return {{"dtype", dtype}, {"shape", std::move(shape)}, {"data_offsets", {begin, end}}};
}

void expect_same(const std::vector<HeaderTensor>& a, const std::vector<HeaderTensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].dtype, b[i].dtype) << a[i].name;
    EXPECT_EQ(a[i].shape, b[i].shape) << a[i].name;
    EXPECT_EQ(a[i].begin, b[i].begin) << a[i].name;
    EXPECT_EQ(a[i].end, b[i].end) << a[i].name;
  }
}

std::vector<HeaderTensor> every_dtype() {
  return lay_out({tensor("f64", at::kDouble, {3}), tensor("f32", at::kFloat, {2, 3}),
                  tensor("f16", at::kHalf, {5}), tensor("bf16", at::kBFloat16, {1, 3}),
                  tensor("i64", at::kLong, {2}), tensor("i32", at::kInt, {4, 1}),
                  tensor("i16", at::kShort, {3}), tensor("i8", at::kChar, {7}),
                  tensor("u8", at::kByte, {2, 2, 2}), tensor("bool", at::kBool, {5})});
}

TEST(Dtype, NamesRoundTripWithSizes) {
  const std::vector<std::pair<at::ScalarType, size_t>> dtypes = {
      {at::kDouble, 8}, {at::kFloat, 4}, {at::kHalf, 2}, {at::kBFloat16, 2}, {at::kLong, 8},
      {at::kInt, 4},    {at::kShort, 2}, {at::kChar, 1}, {at::kByte, 1},     {at::kBool, 1}};
  for (const auto& [t, size] : dtypes) {
    EXPECT_TRUE(is_supported(t));
    EXPECT_EQ(parse_dtype(dtype_name(t), kFile), t);
    EXPECT_EQ(element_size(t), size);
  }
  EXPECT_EQ(dtype_name(at::kBFloat16), "BF16");
  EXPECT_TRUE(is_floating(at::kHalf));
  EXPECT_FALSE(is_floating(at::kLong));
  EXPECT_FALSE(is_supported(at::kComplexFloat));
  EXPECT_EQ(element_size(at::kComplexFloat), 0u);
  EXPECT_THROW(dtype_name(at::kComplexFloat), InvalidArgument);
  EXPECT_FALSE(find_dtype("f32").has_value());
  try {
    parse_dtype("C64", kFile);
    ADD_FAILURE() << "parsed C64";
  } catch (const FormatError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBadHeader);
    EXPECT_NE(std::string(e.what()).find("C64"), std::string::npos) << e.what();
  }
}

TEST(Dtype, CheckedNbytes) {
  EXPECT_EQ(checked_nbytes(at::kFloat, {}), 4u);
  EXPECT_EQ(checked_nbytes(at::kFloat, {2, 3}), 24u);
  EXPECT_EQ(checked_nbytes(at::kFloat, {0, 3}), 0u);
  EXPECT_FALSE(checked_nbytes(at::kFloat, {-1}).has_value());
  EXPECT_FALSE(checked_nbytes(at::kFloat, {int64_t{1} << 62, 8}).has_value());
  EXPECT_FALSE(checked_nbytes(at::kDouble, {int64_t{1} << 61}).has_value());
  EXPECT_FALSE(checked_nbytes(at::kFloat, {0, int64_t{1} << 62, int64_t{1} << 62}).has_value());
  EXPECT_FALSE(checked_nbytes(at::kComplexFloat, {1}).has_value());
}

TEST(SafetensorsHeader, RoundTripsEveryDtype) {
  const auto tensors = every_dtype();
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"id", "snap-1"}};
  const std::string header = build_header(tensors, metadata);
  const std::string file = header + data_for(tensors);

  ASSERT_EQ(header.size() % kAlignment, 0u);
  const uint64_t n = parse_length_prefix(kFile, header, header.size());
  EXPECT_EQ(n, header.size());
  // The JSON is followed by space padding only.
  const std::string text = header.substr(8);
  const size_t json_end = text.find_last_not_of(' ') + 1;
  EXPECT_EQ(text[json_end - 1], '}');
  EXPECT_TRUE(json::parse(text.substr(0, json_end)).is_object());

  const Header h = parse_header(kFile, file, file.size());
  EXPECT_EQ(h.data_offset, header.size());
  EXPECT_EQ(h.metadata, metadata);
  expect_same(h.tensors, tensors);
}

TEST(SafetensorsHeader, RoundTripsZeroDimAndEmptyTensors) {
  const auto tensors =
      lay_out({tensor("scalar", at::kFloat, {}), tensor("empty", at::kLong, {0}),
               tensor("hollow", at::kBFloat16, {3, 0, 2}), tensor("byte", at::kByte, {})});
  const std::string file = build_header(tensors, {}) + data_for(tensors);
  const Header h = parse_header(kFile, file, file.size());
  expect_same(h.tensors, tensors);
  EXPECT_TRUE(h.metadata.empty());
  EXPECT_EQ(file.size() - h.data_offset, 5u);  // 4 bytes of F32 scalar + 1 of U8.
}

TEST(SafetensorsHeader, HeaderWithoutTensors) {
  const std::string header = build_header({}, {});
  EXPECT_EQ(header.size(), kAlignment);
  const Header h = parse_header(kFile, header, header.size());
  EXPECT_EQ(h.data_offset, kAlignment);
  EXPECT_TRUE(h.tensors.empty());
}

TEST(SafetensorsHeader, PadsLargeHeadersToAlignment) {
  std::vector<HeaderTensor> ts;
  for (int i = 0; i < 300; ++i) {
    ts.push_back(
        tensor("model.layers." + std::to_string(i) + ".attention.weight", at::kFloat, {2, 2}));
  }
  ts = lay_out(std::move(ts));
  const std::string header = build_header(ts, {{"format", "pt"}});
  EXPECT_GT(header.size(), kAlignment);
  EXPECT_EQ(header.size() % kAlignment, 0u);
  const std::string file = header + data_for(ts);
  expect_same(parse_header(kFile, file, file.size()).tensors, ts);
}

TEST(SafetensorsHeader, BuildRejectsBadInput) {
  EXPECT_THROW(build_header(lay_out({tensor("__metadata__", at::kFloat, {1})}), {}),
               InvalidArgument);
  EXPECT_THROW(build_header(lay_out({tensor("", at::kFloat, {1})}), {}), InvalidArgument);
  EXPECT_THROW(build_header({HeaderTensor{"c", at::kComplexFloat, {1}, 0, 8}}, {}),
               InvalidArgument);
  auto ts = lay_out({tensor("a", at::kFloat, {2}), tensor("b", at::kFloat, {2})});
  ts[1].name = "a";
  EXPECT_THROW(build_header(ts, {}), InvalidArgument);
  ts[1].name = "b";
  ts[1].begin += 4;  // A hole.
  ts[1].end += 4;
  try {
    build_header(ts, {});
    ADD_FAILURE() << "built a header with a hole";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
  }
}

TEST(SafetensorsHeader, ReadsHeaderFromFile) {
  TempDir dir;
  const auto tensors = every_dtype();
  const fs::path path = dir.path() / kFile;
  std::ofstream(path, std::ios::binary)
      << build_header(tensors, {{"format", "pt"}}) << data_for(tensors);
  const Header h = read_header(path);
  expect_same(h.tensors, tensors);
  EXPECT_EQ(h.metadata.at("format"), "pt");

  try {
    read_header(dir.path() / "missing.safetensors");
    ADD_FAILURE() << "read a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("missing.safetensors"), std::string::npos);
  }
}

TEST(SafetensorsHeader, ReadRejectsTruncatedFile) {
  TempDir dir;
  const fs::path path = dir.path() / kFile;
  std::ofstream(path, std::ios::binary) << le64(64) << "{}";
  try {
    read_header(path);
    ADD_FAILURE() << "read a truncated file";
  } catch (const FormatError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTruncated);
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos);
  }
}

TEST(SafetensorsHeader, RejectsFileShorterThanLengthPrefix) {
  expect_rejected("", ErrorCode::kTruncated);
  expect_rejected("\x02\0\0\0", ErrorCode::kTruncated, "8-byte");
  // The file claims more bytes than the caller read.
  expect_rejected(le64(2), ErrorCode::kTruncated, "", 4096);
}

TEST(SafetensorsHeader, RejectsHeaderLongerThanFile) {
  expect_rejected(le64(100) + "{}", ErrorCode::kTruncated, "header length 100");
}

TEST(SafetensorsHeader, RejectsHugeHeaderLength) {
  expect_rejected(le64(kMaxHeaderBytes + 1), ErrorCode::kHeaderTooLarge, "exceeds");
  expect_rejected(le64(UINT64_MAX), ErrorCode::kHeaderTooLarge);
  // The cap wins over the file size: a huge N is never allocated or read.
  expect_rejected(le64(UINT64_MAX - 7), ErrorCode::kHeaderTooLarge, "", UINT64_MAX - 1);
}

TEST(SafetensorsHeader, RejectsInvalidJson) {
  expect_rejected(image(std::string("{\"a\": "), 0), ErrorCode::kBadHeader, "JSON");
  expect_rejected(image(std::string(""), 0), ErrorCode::kBadHeader, "JSON");
  expect_rejected(image(std::string("{} {}"), 0), ErrorCode::kBadHeader, "JSON");
  expect_rejected(image(std::string("{\"\xff\": 1}"), 0), ErrorCode::kBadHeader, "JSON");
  expect_rejected(image(std::string("{\"a\0\": 1}", 9), 0), ErrorCode::kBadHeader, "JSON");
  // Deep nesting neither overflows the stack nor is accepted.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  expect_rejected(image(deep, 0), ErrorCode::kBadHeader, "nesting deeper than 64 levels");
  expect_rejected(image(std::string(100000, '['), 0), ErrorCode::kBadHeader, "JSON");
}

TEST(SafetensorsHeader, RejectsNonObjectJson) {
  for (const char* text : {"[]", "null", "\"header\"", "42"}) {
    expect_rejected(image(std::string(text), 0), ErrorCode::kBadHeader, "not a JSON object");
  }
}

TEST(SafetensorsHeader, RejectsUnknownDtype) {
  expect_rejected(image(json{{"w", entry("F8", {4}, 0, 4)}}, 4), ErrorCode::kBadHeader,
                  "tensor 'w': unknown dtype \"F8\"");
  expect_rejected(image(json{{"w", entry("f32", {1}, 0, 4)}}, 4), ErrorCode::kBadHeader,
                  "unknown dtype");
}

TEST(SafetensorsHeader, RejectsWrongFieldTypes) {
  const auto bad = [](json e, const std::string& detail) {
    expect_rejected(image(json{{"w", std::move(e)}}, 8), ErrorCode::kBadHeader, detail);
  };
  bad(json::array({1, 2}), "tensor 'w' is array");
  bad({{"shape", {2}}, {"data_offsets", {0, 8}}}, "has no \"dtype\"");
  bad({{"dtype", 4}, {"shape", {2}}, {"data_offsets", {0, 8}}}, "\"dtype\" is number");
  bad({{"dtype", "F32"}, {"shape", "2"}, {"data_offsets", {0, 8}}}, "\"shape\" is string");
  bad({{"dtype", "F32"}, {"shape", {2.0}}, {"data_offsets", {0, 8}}}, "not an integer");
  bad({{"dtype", "F32"}, {"shape", {2}}}, "has no \"data_offsets\"");
  bad({{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8, 8}}}, "expected 2");
  bad({{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {-1, 8}}}, "negative");
  bad({{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", json::array({"0", "8"})}},
      "not an integer");
  expect_rejected(image(json{{"__metadata__", {1, 2}}}, 0), ErrorCode::kBadHeader,
                  "\"__metadata__\" is array");
  expect_rejected(image(json{{"__metadata__", {{"step", 3}}}}, 0), ErrorCode::kBadHeader,
                  "value of 'step' is number");
}

TEST(SafetensorsHeader, RejectsNegativeOrHugeDimension) {
  expect_rejected(image(json{{"w", entry("F32", {-2}, 0, 8)}}, 8), ErrorCode::kBadHeader,
                  "tensor 'w' shape[0] is negative");
  expect_rejected(image(json{{"w", entry("F32", {uint64_t{1} << 63}, 0, 8)}}, 8),
                  ErrorCode::kBadHeader, "larger than");
}

TEST(SafetensorsHeader, RejectsShapeByteMismatch) {
  expect_rejected(image(json{{"w", entry("F32", {3}, 0, 8)}}, 8), ErrorCode::kBadOffsets,
                  "tensor 'w': F32 [3] needs 12 bytes");
  expect_rejected(image(json{{"w", entry("BF16", json::array(), 0, 4)}}, 4), ErrorCode::kBadOffsets,
                  "needs 2 bytes");
}

TEST(SafetensorsHeader, RejectsOverflowingShapes) {
  expect_rejected(image(json{{"w", entry("F32", {int64_t{1} << 62, 8}, 0, 0)}}, 0),
                  ErrorCode::kBadOffsets, "overflows");
  // 2^62 * 2^62 * 2^4 wraps to 0 in 64-bit arithmetic: still caught.
  expect_rejected(
      image(json{{"w", entry("F32", {int64_t{1} << 62, int64_t{1} << 62, 16}, 0, 0)}}, 0),
      ErrorCode::kBadOffsets, "overflows");
  expect_rejected(image(json{{"w", entry("U8", {0, int64_t{1} << 62, int64_t{1} << 62}, 0, 0)}}, 0),
                  ErrorCode::kBadOffsets, "overflows");
}

TEST(SafetensorsHeader, RejectsOverlappingRanges) {
  expect_rejected(image(json{{"a", entry("F32", {2}, 0, 8)}, {"b", entry("F32", {2}, 4, 12)}}, 12),
                  ErrorCode::kBadOffsets, "tensors 'a' [0, 8) and 'b' [4, 12) overlap");
  expect_rejected(image(json{{"a", entry("F32", {2}, 0, 8)}, {"b", entry("F32", {2}, 0, 8)}}, 8),
                  ErrorCode::kBadOffsets, "overlap");
  // An empty tensor may not sit inside another one either.
  expect_rejected(image(json{{"a", entry("F32", {2}, 0, 8)}, {"b", entry("F32", {0}, 4, 4)}}, 8),
                  ErrorCode::kBadOffsets, "overlap");
}

TEST(SafetensorsHeader, RejectsHoles) {
  expect_rejected(image(json{{"a", entry("F32", {1}, 0, 4)}, {"b", entry("F32", {1}, 8, 12)}}, 12),
                  ErrorCode::kBadOffsets, "bytes [4, 8) before tensor 'b'");
  expect_rejected(image(json{{"a", entry("F32", {1}, 4, 8)}}, 8), ErrorCode::kBadOffsets,
                  "bytes [0, 4)");
  // Trailing bytes after the last tensor.
  expect_rejected(image(json{{"a", entry("F32", {1}, 0, 4)}}, 6), ErrorCode::kBadOffsets,
                  "bytes [4, 6) at its end");
  expect_rejected(image(json::object(), 1), ErrorCode::kBadOffsets, "bytes [0, 1)");
}

TEST(SafetensorsHeader, RejectsOffsetsOutsideFile) {
  expect_rejected(image(json{{"a", entry("F32", {2}, 0, 8)}}, 4), ErrorCode::kBadOffsets,
                  "tensor 'a': data_offsets [0, 8) is not a range inside the data section of 4");
  expect_rejected(image(json{{"a", entry("F32", {0}, 8, 4)}}, 8), ErrorCode::kBadOffsets, "[8, 4)");
  expect_rejected(image(json{{"a", entry("U8", {0}, UINT64_MAX, UINT64_MAX)}}, 0),
                  ErrorCode::kBadOffsets, "data_offsets");
}

// --- The independent Python reader (tests/format/safetensors_reader.py) ----------------------

using test_support::have_python;
using test_support::ReaderRun;
using test_support::run_reference_reader;

TEST(SafetensorsReferenceReader, AcceptsOurShards) {
  if (!have_python()) GTEST_SKIP() << "python3 is not installed";
  TempDir dir;
  std::vector<HeaderTensor> tensors = every_dtype();
  tensors.push_back(tensor("scalar", at::kDouble, {}));
  tensors.push_back(tensor("empty", at::kFloat, {0, 4}));
  tensors = lay_out(std::move(tensors));
  const std::string data = data_for(tensors);
  const fs::path path = dir.path() / kFile;
  std::ofstream(path, std::ios::binary) << build_header(tensors, {{"format", "pt"}}) << data;

  const ReaderRun run = run_reference_reader(path);
  ASSERT_EQ(run.status, 0) << run.output;
  std::istringstream lines(run.output);
  std::string line;
  size_t seen = 0;
  while (std::getline(lines, line) && line.rfind("OK", 0) != 0) {
    const json j = json::parse(line);
    ASSERT_LT(seen, tensors.size());
    const HeaderTensor& t = tensors[seen++];
    uint64_t byte_sum = 0;
    for (uint64_t i = t.begin; i < t.end; ++i) byte_sum += static_cast<unsigned char>(data[i]);
    EXPECT_EQ(j["name"].get<std::string>(), t.name);
    EXPECT_EQ(j["dtype"].get<std::string>(), dtype_name(t.dtype));
    EXPECT_EQ(j["shape"].get<std::vector<int64_t>>(), t.shape);
    EXPECT_EQ(j["begin"], t.begin);
    EXPECT_EQ(j["end"], t.end);
    EXPECT_EQ(j["byte_sum"], byte_sum) << t.name;
  }
  EXPECT_EQ(seen, tensors.size());
  EXPECT_EQ(line, "OK " + std::to_string(tensors.size()) + " tensors");
}

TEST(SafetensorsReferenceReader, RejectsWhatWeReject) {
  if (!have_python()) GTEST_SKIP() << "python3 is not installed";
  TempDir dir;
  const std::vector<std::string> bad = {
      std::string("\x01\0\0", 3),
      le64(100) + "{}",
      image(std::string("[]"), 0),
      image(json{{"w", entry("F8", {1}, 0, 1)}}, 1),
      image(json{{"w", entry("F32", {3}, 0, 8)}}, 8),
      image(json{{"a", entry("F32", {2}, 0, 8)}, {"b", entry("F32", {2}, 4, 12)}}, 12),
      image(json{{"a", entry("F32", {1}, 0, 4)}}, 6),
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    const fs::path path = dir.path() / ("bad" + std::to_string(i) + ".safetensors");
    std::ofstream(path, std::ios::binary) << bad[i];
    EXPECT_THROW(read_header(path), FormatError) << i;
    const ReaderRun run = run_reference_reader(path, /*tsnap_rules=*/false);
    EXPECT_EQ(run.status, 1) << i << ": " << run.output;
  }
  // A valid safetensors file that is not laid out the tsnap way passes only without --tsnap.
  const fs::path plain = dir.path() / "plain.safetensors";
  std::ofstream(plain, std::ios::binary)
      << image(json{{"a", entry("U8", {1}, 0, 1)}, {"b", entry("F32", {1}, 1, 5)}}, 5);
  EXPECT_EQ(run_reference_reader(plain, false).status, 0);
  EXPECT_EQ(run_reference_reader(plain, true).status, 1);
}

}  // namespace
}  // namespace tsnap::format
