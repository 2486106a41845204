// Bounded JSON (format/json_bounds.h) and the parsers that use it: deep nesting, value bombs,
// NUL bytes and too many dimensions are refused with a format error, without exhausting the
// stack or memory.

#include "format/json_bounds.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

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

// A document scanned in pieces, with whole values scanned apart and added, has exactly the
// problem of the whole (the same words, offsets from the document's start): depth crossed
// inside a part at any level, a NUL byte in a part, a part that is not a whole value.
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
  const std::string nul = std::string("[1,\"") + '\0' + "\"]";
  const std::string before = "{\"a\":[1,2],\"b\":", after = ",\"c\":\"]]]\"}";
  for (const std::string& value : std::vector<std::string>{
           "[]", std::string("{\"x\":[1,[2,[3]]],\"y\":\"[{\"}"), std::string("7"), nested(3),
           nested(4), nested(5), nested(6), nested(70), "[[1],[[2]],[[[3,[4]]]]]", nul,
           "[" + nested(6) + "," + nul + "]"}) {
    for (size_t max_depth : {size_t{3}, size_t{4}, size_t{5}, kMaxJsonDepth}) {
      EXPECT_EQ(pieces(before, value, after, max_depth),
                json_bounds_problem(before + value + after, max_depth))
          << value << " within " << max_depth;
    }
  }
  EXPECT_EQ(pieces(before, nested(6), after, 4), "nesting deeper than 4 levels at offset 18");
  EXPECT_EQ(pieces(before, nul, after, kMaxJsonDepth), "a NUL byte at offset 19");
  EXPECT_EQ(pieces(before, "[]", std::string(1, '\0'), kMaxJsonDepth), "a NUL byte at offset 17");
  // A part that is not a whole value, and one added inside a string.
  EXPECT_NE(pieces(before, "[1,2", after, kMaxJsonDepth).find("not a whole value"),
            std::string::npos);
  EXPECT_NE(pieces("{\"k\":\"x", "{\"a\":\"[\"}", "\"[]}", 2).find("inside a string"),
            std::string::npos);
  // A document of parts added in turn is itself a part: depth counts through both.
  JsonBounds inner;
  inner.scan("[");
  JsonBounds deep;
  deep.scan(nested(5));
  inner.add(deep);
  inner.scan("]");
  JsonBounds outer(4);
  outer.scan("{\"b\":");
  outer.add(inner);
  outer.scan("}");
  EXPECT_EQ(outer.problem(), json_bounds_problem("{\"b\":[" + nested(5) + "]}", 4));
  EXPECT_EQ(outer.problem(), "nesting deeper than 4 levels at offset 8");
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
