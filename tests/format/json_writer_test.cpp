// Tests of the streaming JSON writer (src/format/json_writer.h) and the text it produces for
// safetensors headers and MANIFEST.json.

#include "format/json_writer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "format/manifest_io.h"
#include "format/safetensors.h"
#include "tsnap/error.h"
#include "tsnap/manifest.h"

namespace tsnap::format {
namespace {

using nlohmann::json;

// The JSON of manifest_to_text(m) without its checksum member, which manifest_to_json lacks.
json text_json(const Manifest& m) {
  json j = json::parse(manifest_to_text(m));
  j.erase("checksum");
  return j;
}

using namespace std::string_literals;

std::string escaped(std::string_view s) {
  std::string out;
  append_json_string(out, s);
  return out;
}

TEST(JsonWriter, EscapesQuotesBackslashesAndControlChars) {
  EXPECT_EQ(escaped(""), R"("")");
  EXPECT_EQ(escaped("plain.name_1"), R"("plain.name_1")");
  EXPECT_EQ(escaped(R"(a"b\c)"), R"("a\"b\\c")");
  EXPECT_EQ(escaped("\b\f\n\r\t"), R"("\b\f\n\r\t")");
  EXPECT_EQ(escaped("x\x01y\x1f"), R"("x\u0001y\u001f")");
  EXPECT_EQ(escaped("a\0b"s), R"("a\u0000b")");
  EXPECT_EQ(escaped("\x7f/"), "\"\x7f/\"");  // DEL and '/' need no escape.
}

TEST(JsonWriter, EveryByteBelow0x80RoundTripsThroughNlohmann) {
  std::string all;
  for (int c = 0; c < 0x80; ++c) all += static_cast<char>(c);
  EXPECT_EQ(json::parse(escaped(all)).get<std::string>(), all);
}

TEST(JsonWriter, PassesValidUtf8Through) {
  const std::string s = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xef\xbf\xbf \xf4\x8f\xbf\xbf";
  EXPECT_EQ(escaped(s), "\"" + s + "\"");
  EXPECT_EQ(json::parse(escaped(s)).get<std::string>(), s);
}

TEST(JsonWriter, RejectsInvalidUtf8) {
  for (const std::string bad : {"\x80"s, "a\xc3"s, "\xc0\xaf"s, "\xe0\x80\xaf"s, "\xed\xa0\x80"s,
                                "\xf4\x90\x80\x80"s, "\xf5\x80\x80\x80"s, "\xff"s, "\xe2\x82"s}) {
    EXPECT_THROW(escaped(bad), InvalidArgument) << json(bad.size());
  }
}

TEST(JsonWriter, Numbers) {
  std::string out;
  JsonWriter w(out);
  w.begin_array();
  w.number(uint64_t{0});
  w.number(std::numeric_limits<uint64_t>::max());
  w.number(int64_t{-1});
  w.number(std::numeric_limits<int64_t>::min());
  w.number(std::numeric_limits<int64_t>::max());
  w.end_array();
  EXPECT_EQ(out, "[0,18446744073709551615,-1,-9223372036854775808,9223372036854775807]");
  const json j = json::parse(out);
  EXPECT_EQ(j[1].get<uint64_t>(), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(j[3].get<int64_t>(), std::numeric_limits<int64_t>::min());
}

TEST(JsonWriter, NestingAndCommas) {
  std::string out;
  JsonWriter w(out);
  w.begin_object();
  w.key("empty_obj");
  w.begin_object();
  w.end_object();
  w.key("empty_arr");
  w.begin_array();
  w.end_array();
  w.newline();
  w.key("nested");
  w.begin_array();
  w.begin_array();
  w.number(int64_t{1});
  w.end_array();
  w.begin_object();
  w.key("k");
  w.string("v");
  w.end_object();
  w.raw(R"({"x":[1,2]})");
  w.string("s");
  w.end_array();
  w.key("last");
  w.raw("null");
  w.newline();  // Before a closing bracket: no trailing comma.
  w.end_object();
  EXPECT_EQ(out,
            "{\"empty_obj\":{},\"empty_arr\":[],\n"
            R"("nested":[[1],{"k":"v"},{"x":[1,2]},"s"],"last":null)"
            "\n}");
  EXPECT_EQ(json::parse(out), json::parse(R"({"empty_obj":{},"empty_arr":[],
      "nested":[[1],{"k":"v"},{"x":[1,2]},"s"],"last":null})"));
}

/// A manifest with names that need escaping, a shard, an empty file and nested metadata.
Manifest awkward() {
  Manifest m;
  m.id = "id \"quoted\"";
  m.tsnap_version = "0.1.0";
  m.torch_version = "2.1";
  m.created = "2026-01-01T00:00:00Z";
  m.created_unix_ns = 1767225600000000007;
  m.world_size = 3;
  m.metadata = {{"note", "tab\there \xc3\xa9"}, {"nested", {{"a", {1, -2, 0.5}}}}, {"z", nullptr}};
  m.files = {{"b.safetensors", 4096 + 24, 4096, 4096, {0x0123456789abcdefull, 0}},
             {"a.safetensors", 4096, 4096, 8192, {~0ull}}};
  m.tensors = {
      {"w\"\\\n\x01",
       "b.safetensors",
       at::kBFloat16,
       at::kFloat,
       {2, 3},
       4096,
       4108,
       ShardSpec{{4, 3}, {2, 0}}},
      {"a\0b"s, "b.safetensors", at::kFloat, at::kFloat, {}, 4108, 4112, std::nullopt},
      {"\xe2\x82\xac.bias", "b.safetensors", at::kLong, at::kLong, {1}, 4112, 4120, std::nullopt},
      {"empty", "b.safetensors", at::kFloat, at::kFloat, {0, 5}, 4120, 4120, std::nullopt},
  };
  return m;
}

TEST(ManifestText, SameJsonAsManifestToJson) {
  const Manifest m = awkward();
  const std::string text = manifest_to_text(m);
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(text_json(m), manifest_to_json(m));
  // One line per file, tensor and weight_map entry, and the checksum (names hold no raw newline
  // once escaped).
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'),
            static_cast<long>(1 + 2 + 1 + m.files.size() + 2 * m.tensors.size()));
}

TEST(ManifestText, RoundTripsThroughParseManifest) {
  const Manifest m = awkward();
  const Manifest back = parse_manifest(manifest_to_text(m), "MANIFEST.json");
  EXPECT_EQ(manifest_to_json(back), manifest_to_json(m));
  EXPECT_EQ(manifest_to_text(back), manifest_to_text(m));
}

TEST(ManifestText, EmptyManifest) {
  Manifest m;
  m.id = "x";
  EXPECT_EQ(text_json(m), manifest_to_json(m));
}

TEST(ManifestText, RejectsWhatManifestToJsonRejects) {
  Manifest m = awkward();
  m.metadata = json::array();
  EXPECT_THROW(manifest_to_text(m), InvalidArgument);
  m = awkward();
  m.tensors.push_back(m.tensors[0]);
  EXPECT_THROW(manifest_to_text(m), InvalidArgument);
  m = awkward();
  m.files.push_back(m.files[0]);
  EXPECT_THROW(manifest_to_text(m), InvalidArgument);
  m = awkward();
  m.tensors[0].name = "bad \xff";
  EXPECT_THROW(manifest_to_text(m), InvalidArgument);
}

TEST(HeaderText, AwkwardNamesRoundTripThroughParseHeader) {
  const std::vector<HeaderTensor> tensors = {
      {"w\"\\\n\x01", at::kDouble, {2}, 0, 16},
      {"a\0b"s, at::kFloat, {1, 1}, 16, 20},
      {"\xe2\x82\xac", at::kBool, {}, 20, 21},
  };
  const std::map<std::string, std::string> metadata = {{"k\"ey", "v\nal"}, {"tsnap_id", "x"}};
  const std::string header = build_header(tensors, metadata);
  ASSERT_EQ(header.size() % kAlignment, 0u);
  const std::string file = header + std::string(21, '\0');
  const Header h = parse_header("f", file, file.size());
  EXPECT_EQ(h.data_offset, header.size());
  EXPECT_EQ(h.metadata, metadata);
  ASSERT_EQ(h.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(h.tensors[i].name, tensors[i].name);
    EXPECT_EQ(h.tensors[i].dtype, tensors[i].dtype);
    EXPECT_EQ(h.tensors[i].shape, tensors[i].shape);
    EXPECT_EQ(h.tensors[i].begin, tensors[i].begin);
    EXPECT_EQ(h.tensors[i].end, tensors[i].end);
  }
  EXPECT_THROW(build_header({{"bad \xc3", at::kFloat, {1}, 0, 4}}, {}), InvalidArgument);
}

}  // namespace
}  // namespace tsnap::format
