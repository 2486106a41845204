#include "common/text_table.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <iterator>
#include <stdexcept>
#include <utility>

#include "common/hex.h"

namespace tsnap::detail {

std::string count_of(uint64_t n, const std::string& singular, const std::string& plural) {
  return std::to_string(n) + " " + (n == 1 ? singular : plural);
}
namespace {

// The code point at `text[i]` and its length in bytes; an invalid sequence is one byte, as
// code point 0xFFFD.
std::pair<char32_t, size_t> decode(const std::string& text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b = byte(i);
  if (b < 0x80) return {b, 1};
  size_t len = b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : b >= 0xc0 ? 2 : 0;
  if (len == 0 || b > 0xf4 || i + len > text.size()) return {0xfffd, 1};
  char32_t cp = b & (0x7f >> len);
  for (size_t k = 1; k < len; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) return {0xfffd, 1};
    cp = (cp << 6) | (byte(i + k) & 0x3f);
  }
  static constexpr char32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return {0xfffd, 1};
  return {cp, len};
}

int width_of(char32_t cp) {
  struct Range {
    char32_t first, last;
  };
  static constexpr Range kZero[] = {
      {0x0300, 0x036f}, {0x0483, 0x0489}, {0x0591, 0x05bd}, {0x0610, 0x061a}, {0x064b, 0x065f},
      {0x0e31, 0x0e31}, {0x0e34, 0x0e3a}, {0x1ab0, 0x1aff}, {0x1dc0, 0x1dff}, {0x200b, 0x200f},
      {0x20d0, 0x20ff}, {0xfe00, 0xfe0f}, {0xfe20, 0xfe2f}, {0xfeff, 0xfeff}};
  static constexpr Range kWide[] = {{0x1100, 0x115f},   {0x2e80, 0x303e},   {0x3041, 0x33ff},
                                    {0x3400, 0x4dbf},   {0x4e00, 0x9fff},   {0xa000, 0xa4cf},
                                    {0xac00, 0xd7a3},   {0xf900, 0xfaff},   {0xfe30, 0xfe4f},
                                    {0xff00, 0xff60},   {0xffe0, 0xffe6},   {0x1f300, 0x1f64f},
                                    {0x1f900, 0x1f9ff}, {0x20000, 0x2fffd}, {0x30000, 0x3fffd}};
  const auto in = [cp](const auto& ranges) {
    return std::any_of(std::begin(ranges), std::end(ranges),
                       [cp](const Range& r) { return cp >= r.first && cp <= r.last; });
  };
  if (in(kZero)) return 0;
  return in(kWide) ? 2 : 1;
}

bool is_control(char32_t cp) { return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f); }

// A cell as it may reach a terminal: control characters (a key may hold any of them) as \xNN
// per byte, so that a name can neither break the table's lines nor send escape sequences (C1's
// CSI, U+009B, included).
std::string escaped(const std::string& cell) {
  std::string out;
  for (size_t i = 0; i < cell.size();) {
    const auto [cp, len] = decode(cell, i);
    if (!is_control(cp)) {
      out.append(cell, i, len);
    } else {
      for (size_t k = i; k < i + len; ++k) {
        detail::append_escaped_byte(out, static_cast<unsigned char>(cell[k]));
      }
    }
    i += len;
  }
  return out;
}

}  // namespace

std::string human_bytes(uint64_t n) {
  static constexpr std::array<const char*, 6> kUnits = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (n < 1024) return std::to_string(n) + " B";
  double value = static_cast<double>(n);
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < kUnits.size()) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %s", value, kUnits[unit]);
  return text;
}

size_t display_width(const std::string& text) {
  size_t width = 0;
  for (size_t i = 0; i < text.size();) {
    const auto [cp, len] = decode(text, i);
    width += static_cast<size_t>(width_of(cp));
    i += len;
  }
  return width;
}

Table::Table(std::vector<std::string> headers)
    : headers_(std::move(headers)), numeric_(headers_.size(), false) {}

void Table::set_numeric(size_t column) { numeric_.at(column) = true; }

void Table::add_row(std::vector<std::string> cells) {
  if (cells.size() != headers_.size()) throw std::logic_error("Table::add_row: wrong cell count");
  for (std::string& cell : cells) cell = escaped(cell);
  rows_.push_back(std::move(cells));
}

void Table::print(std::ostream& out) const {
  std::vector<size_t> widths(headers_.size());
  for (size_t c = 0; c < headers_.size(); ++c) {
    widths[c] = display_width(headers_[c]);
    for (const auto& row : rows_) widths[c] = std::max(widths[c], display_width(row[c]));
  }
  auto print_row = [&](const std::vector<std::string>& cells) {
    std::string line;
    for (size_t c = 0; c < cells.size(); ++c) {
      const bool last = c + 1 == cells.size();
      const std::string pad(widths[c] - display_width(cells[c]), ' ');
      if (c > 0) line += "  ";
      if (numeric_[c]) {
        line += pad + cells[c];
      } else {
        line += cells[c];
        if (!last) line += pad;  // no trailing spaces
      }
    }
    out << line << '\n';
  };
  print_row(headers_);
  for (const auto& row : rows_) print_row(row);
}

}  // namespace tsnap::detail
