#include "common/text_table.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <stdexcept>
#include <utility>

namespace tsnap::detail {

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

Table::Table(std::vector<std::string> headers)
    : headers_(std::move(headers)), numeric_(headers_.size(), false) {}

void Table::set_numeric(size_t column) { numeric_.at(column) = true; }

namespace {

// A cell as it may reach a terminal: control bytes (a key may hold any of them) as \xNN, so
// that a name can neither break the table's lines nor send escape sequences.
std::string escaped(std::string cell) {
  const auto control = [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; };
  if (std::none_of(cell.begin(), cell.end(), control)) return cell;
  std::string out;
  for (char c : cell) {
    if (!control(c)) {
      out += c;
      continue;
    }
    static const char kHex[] = "0123456789abcdef";
    const auto u = static_cast<unsigned char>(c);
    out += "\\x";
    out += kHex[u >> 4];
    out += kHex[u & 15];
  }
  return out;
}

}  // namespace

void Table::add_row(std::vector<std::string> cells) {
  if (cells.size() != headers_.size()) throw std::logic_error("Table::add_row: wrong cell count");
  for (std::string& cell : cells) cell = escaped(std::move(cell));
  rows_.push_back(std::move(cells));
}

void Table::print(std::ostream& out) const {
  std::vector<size_t> widths(headers_.size());
  for (size_t c = 0; c < headers_.size(); ++c) {
    widths[c] = headers_[c].size();
    for (const auto& row : rows_) widths[c] = std::max(widths[c], row[c].size());
  }
  auto print_row = [&](const std::vector<std::string>& cells) {
    std::string line;
    for (size_t c = 0; c < cells.size(); ++c) {
      const bool last = c + 1 == cells.size();
      const std::string pad(widths[c] - cells[c].size(), ' ');
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
