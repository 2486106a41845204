// Glob patterns over state-dict keys (common/glob.h).

#include "common/glob.h"

#include <gtest/gtest.h>

#include "tsnap/error.h"

namespace tsnap::detail {
namespace {

TEST(Glob, StarMatchesAnyRunIncludingDotsAndSlashes) {
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_TRUE(glob_match("*", "encoder.0.weight"));
  EXPECT_TRUE(glob_match("*.weight", "encoder.0.weight"));
  EXPECT_TRUE(glob_match("model/*", "model/fc1.weight"));
  EXPECT_TRUE(glob_match("*/exp_avg", "fc1.weight/exp_avg"));
  EXPECT_TRUE(glob_match("a*b*c", "aXXbYYbZZc"));
  EXPECT_TRUE(glob_match("**x", "abx"));
  EXPECT_FALSE(glob_match("*.weight", "fc1.weight.extra"));
  EXPECT_FALSE(glob_match("a*b*c", "aXXbYY"));
  EXPECT_FALSE(glob_match("", "a"));
  EXPECT_TRUE(glob_match("", ""));
}

TEST(Glob, QuestionMarkIsExactlyOneCharacter) {
  EXPECT_TRUE(glob_match("fc?.bias", "fc1.bias"));
  EXPECT_FALSE(glob_match("fc?.bias", "fc.bias"));
  EXPECT_FALSE(glob_match("fc?.bias", "fc12.bias"));
  EXPECT_TRUE(glob_match("fc??.bias", "fc12.bias"));
}

TEST(Glob, CharacterClasses) {
  EXPECT_TRUE(glob_match("layer[123].w", "layer2.w"));
  EXPECT_FALSE(glob_match("layer[123].w", "layer4.w"));
  EXPECT_TRUE(glob_match("layer[0-9].w", "layer7.w"));
  EXPECT_FALSE(glob_match("layer[0-9].w", "layerx.w"));
  EXPECT_TRUE(glob_match("layer[!0-4].w", "layer7.w"));
  EXPECT_FALSE(glob_match("layer[!0-4].w", "layer3.w"));
  EXPECT_TRUE(glob_match("layer[^0-4].w", "layer9.w"));
  EXPECT_TRUE(glob_match("x[a-cx-z]", "xy"));
  EXPECT_FALSE(glob_match("x[a-cx-z]", "xm"));
  EXPECT_TRUE(glob_match("[]]", "]"));  // ']' first in a class is literal
  EXPECT_TRUE(glob_match("[!]]", "a"));
  EXPECT_TRUE(glob_match("[a-]", "-"));  // '-' last in a class is literal
  EXPECT_TRUE(glob_match("*[.]bias", "fc.bias"));
}

TEST(Glob, BackslashEscapesAMetaCharacter) {
  EXPECT_TRUE(glob_match("a\\*b", "a*b"));
  EXPECT_FALSE(glob_match("a\\*b", "aXb"));
  EXPECT_TRUE(glob_match("\\[x\\]", "[x]"));
}

TEST(Glob, MalformedPatternsAreInvalidArguments) {
  for (const char* bad : {"layer[0-9", "[", "x\\", "[!"}) {
    try {
      glob_match(bad, "layer1");
      ADD_FAILURE() << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

const std::vector<std::string> kKeys = {"bn.num_batches_tracked",
                                        "bn.running_mean",
                                        "bn.weight",
                                        "conv.bias",
                                        "conv.weight",
                                        "fc.weight"};

TEST(SelectKeys, NoPatternsSelectEverythingInOrder) {
  EXPECT_EQ(select_keys(kKeys, {}, {}, /*strict=*/true), kKeys);
}

TEST(SelectKeys, IncludeKeepsKeysMatchingAnyPattern) {
  EXPECT_EQ(select_keys(kKeys, {"conv.*", "*.running_*"}, {}, false),
            (std::vector<std::string>{"bn.running_mean", "conv.bias", "conv.weight"}));
}

TEST(SelectKeys, ExcludeDropsKeysMatchingAnyPattern) {
  EXPECT_EQ(select_keys(kKeys, {}, {"bn.*", "*.bias"}, false),
            (std::vector<std::string>{"conv.weight", "fc.weight"}));
}

TEST(SelectKeys, IncludeAndExcludeTogetherAreAnError) {
  EXPECT_THROW(select_keys(kKeys, {"a"}, {"b"}, false), InvalidArgument);
}

TEST(SelectKeys, StrictRejectsAPatternThatMatchesNothing) {
  EXPECT_EQ(select_keys(kKeys, {"conv.*", "decoder.*"}, {}, /*strict=*/false),
            (std::vector<std::string>{"conv.bias", "conv.weight"}));
  try {
    select_keys(kKeys, {"conv.*", "decoder.*"}, {}, /*strict=*/true);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.code(), ErrorCode::kKeyNotFound);
    EXPECT_NE(std::string(e.what()).find("decoder.*"), std::string::npos) << e.what();
  }
  EXPECT_THROW(select_keys(kKeys, {}, {"*.nothing"}, /*strict=*/true), InvalidArgument);
}

}  // namespace
}  // namespace tsnap::detail
