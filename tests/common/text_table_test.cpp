// The tool's tables: display width of non-ASCII cells, and control characters escaped.

#include "common/text_table.h"

#include <gtest/gtest.h>

#include <sstream>

namespace tsnap::detail {
namespace {

TEST(TextTable, DisplayWidthCountsWideAndCombiningCharacters) {
  EXPECT_EQ(display_width("fc1.weight"), 10u);
  EXPECT_EQ(display_width("gewicht.\xc3\xa4"), 9u);          // ä: one column
  EXPECT_EQ(display_width("\xe6\x9d\x83\xe9\x87\x8d"), 4u);  // 权重: two each
  EXPECT_EQ(display_width("e\xcc\x81"), 1u);                 // e + combining acute
  EXPECT_EQ(display_width("\xf0\x9f\x94\xa5"), 2u);          // an emoji
  EXPECT_EQ(display_width("a\xff"
                          "b"),
            3u);                             // an invalid byte: one column
  EXPECT_EQ(display_width("\xe6\x9d"), 2u);  // a cut sequence: per byte
}

TEST(TextTable, ColumnsAlignOnDisplayWidth) {
  Table table({"KEY", "BYTES"});
  table.set_numeric(1);
  table.add_row({"\xe6\x9d\x83\xe9\x87\x8d", "4"});  // 权重, 4 columns in 6 bytes
  table.add_row({"abcde", "512"});
  std::ostringstream out;
  table.print(out);
  std::istringstream lines(out.str());
  std::string line;
  std::vector<size_t> widths;
  while (std::getline(lines, line)) widths.push_back(display_width(line));
  ASSERT_EQ(widths.size(), 3u);
  EXPECT_EQ(widths[0], widths[1]) << out.str();
  EXPECT_EQ(widths[1], widths[2]) << out.str();
}

TEST(TextTable, ControlCharactersAreEscaped) {
  Table table({"KEY"});
  table.add_row(
      {"a\nb\x1b[31m\xc2\x9b"
       "c\x7f\xc3\xa4"});
  std::ostringstream out;
  table.print(out);
  EXPECT_EQ(out.str(), "KEY\na\\x0ab\\x1b[31m\\xc2\\x9bc\\x7f\xc3\xa4\n");
}

}  // namespace
}  // namespace tsnap::detail
