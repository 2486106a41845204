// Bounded JSON (format/json_bounds.h) and the parsers that use it: deep nesting, value bombs,
// NUL bytes and too many dimensions are refused with a format error, without exhausting the
// stack or memory.

#include "format/json_bounds.h"

#include <gtest/gtest.h>

#include <string>

#include "format/dtype.h"
#include "format/manifest_io.h"
#include "format/safetensors.h"
#include "tsnap/error.h"

namespace tsnap::format {
namespace {

std::string nested(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

// A safetensors header (length prefix + JSON) over `data_len` bytes of data.
std::string header_bytes(const std::string& json_text) {
  std::string out(8, '\0');
  uint64_t n = json_text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json_text;
}

ErrorCode header_error(const std::string& json_text, uint64_t data_len = 0) {
  const std::string bytes = header_bytes(json_text);
  try {
    parse_header("f.safetensors", bytes, bytes.size() + data_len);
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::kInternal;  // accepted
}

TEST(JsonBounds, DepthValuesAndNulAreChecked) {
  EXPECT_EQ(json_bounds_problem(nested(kMaxJsonDepth)), "");
  EXPECT_NE(json_bounds_problem(nested(kMaxJsonDepth + 1)).find("nesting deeper"),
            std::string::npos);
  EXPECT_EQ(json_bounds_problem("{\"a\":\"[[[[[[[[[[[[[[[[[[\\\"[[[[\"}", 2), "");  // in strings
  const std::string nul = std::string("{}") + '\0' + "junk";
  EXPECT_NE(json_bounds_problem(nul).find("NUL byte at offset 2"), std::string::npos);
  EXPECT_EQ(json_depth(nlohmann::json::parse(nested(5))), 5u);
  EXPECT_EQ(json_depth(nlohmann::json(3)), 0u);
}

// A document scanned in pieces, with whole values scanned apart and added, has the problem
// of the whole (offsets from the document's start).
TEST(JsonBounds, PiecesScannedApartAddUpToTheWhole) {
  const auto pieces = [](const std::string& before, const std::string& value,
                         const std::string& after, size_t max_depth) {
    JsonBounds part;
    part.scan(value);
    JsonBounds whole(max_depth);
    whole.scan(before);
    whole.add(part);
    whole.scan(after);
    return whole.problem();
  };
  const std::string before = "{\"a\":[1,2],\"b\":", after = ",\"c\":\"]]]\"}";
  for (const std::string value : {"[]", "{\"x\":[1,[2,[3]]],\"y\":\"[{\"}", "7"}) {
    EXPECT_EQ(pieces(before, value, after, kMaxJsonDepth), "") << value;
    EXPECT_EQ(json_bounds_problem(before + value + after), "") << value;
  }
  // Deep in the part only with the levels around it.
  EXPECT_EQ(pieces(before, nested(3), after, 4),
            json_bounds_problem(before + nested(3) + after, 4));
  EXPECT_EQ(json_bounds_problem(before + nested(4) + after, 4),
            "nesting deeper than 4 levels at offset 18");
  EXPECT_EQ(pieces(before, nested(4), after, 4),
            json_bounds_problem(before + nested(4) + after, 4));
  // A NUL byte in the part, and one after it.
  const std::string nul = std::string("[1,\"") + '\0' + "\"]";
  EXPECT_NE(
      pieces(before, nul, after, kMaxJsonDepth).find("NUL byte at offset 4 of a part at offset 15"),
      std::string::npos);
  EXPECT_NE(pieces(before, "[]", std::string(1, '\0'), kMaxJsonDepth).find("NUL byte at offset 17"),
            std::string::npos);
  // A part that is not a whole value.
  EXPECT_NE(pieces(before, "[1,2", after, kMaxJsonDepth).find("not a whole value"),
            std::string::npos);
}

TEST(JsonBounds, AHeaderOfOpeningBracketsIsRefusedWithoutParsingIt) {
  EXPECT_EQ(header_error(std::string(10 << 20, '[')), ErrorCode::kBadHeader);
  EXPECT_EQ(header_error(nested(100000)), ErrorCode::kBadHeader);
}

TEST(JsonBounds, JunkAfterANulByteInAHeaderIsRefused) {
  EXPECT_EQ(header_error(std::string("{}") + '\0' + "garbage"), ErrorCode::kBadHeader);
}

TEST(JsonBounds, TooManyDimensionsAreRefused) {
  std::string shape = "[";
  for (size_t i = 0; i < kMaxDims + 1; ++i) shape += i ? ",1" : "1";
  shape += "]";
  EXPECT_EQ(
      header_error("{\"t\":{\"dtype\":\"F32\",\"shape\":" + shape + ",\"data_offsets\":[0,4]}}", 4),
      ErrorCode::kBadHeader);
}

TEST(JsonBounds, ADeeplyNestedManifestIsABadManifest) {
  const std::string text = "{\"format\":\"tsnap\",\"metadata\":" + nested(100000) + "}";
  try {
    parse_manifest(text, "MANIFEST.json");
    FAIL() << "accepted";
  } catch (const FormatError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBadManifest);
    EXPECT_NE(std::string(e.what()).find("nesting deeper"), std::string::npos) << e.what();
  }
}

TEST(JsonBounds, WritersRefuseMetadataTheirReadersWouldReject) {
  nlohmann::json deep = nlohmann::json::array();
  for (size_t i = 0; i < kMaxJsonDepth; ++i) deep = nlohmann::json::array({deep});
  EXPECT_THROW(check_metadata_writable({{"x", deep}}), InvalidArgument);
  EXPECT_THROW(check_metadata_writable({{"bad", std::string("\xff\xfe")}}), InvalidArgument);
  EXPECT_NO_THROW(check_metadata_writable({{"step", 3}, {"lr", {0.1, 0.2}}}));
  EXPECT_THROW(check_manifest_readable(std::string("{}") + '\0'), InvalidArgument);
}

}  // namespace
}  // namespace tsnap::format
