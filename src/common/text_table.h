#pragma once
// Plain-text output shared by the `tsnap` tool and the benchmarks: aligned tables and byte
// counts spelled for people.

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace tsnap::detail {

/// "1 file", "3 files": a count with its noun, for messages and tables.
std::string count_of(uint64_t n, const std::string& singular, const std::string& plural);

/// "512 B", "1.5 KiB", "297.3 MiB", ... (binary units, one decimal above bytes).
std::string human_bytes(uint64_t n);

/// Columns `text` takes on a terminal: UTF-8 decoded, East Asian wide and fullwidth characters
/// (CJK, Hangul, fullwidth forms, most emoji) count 2, combining marks and zero-width
/// characters 0, anything else (and each byte that is not valid UTF-8) 1.
size_t display_width(const std::string& text);

/// A text table: a header row, then rows, columns separated by two spaces and padded to the
/// widest cell (by display width, so non-ASCII names line up). Columns marked numeric are
/// right-aligned.
/// Thread-safety: none (one thread builds and prints it). Ownership: copies its cells.
class Table {
 public:
  explicit Table(std::vector<std::string> headers);
  /// Right-aligns column `column`.
  void set_numeric(size_t column);
  /// Adds a row; it must have one cell per header (std::logic_error otherwise). Control
  /// characters in a cell (a key may hold any), C0, DEL and C1, are shown escaped, as \xNN for
  /// each byte.
  void add_row(std::vector<std::string> cells);
  bool empty() const { return rows_.empty(); }
  void print(std::ostream& out) const;

 private:
  std::vector<std::string> headers_;
  std::vector<bool> numeric_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace tsnap::detail
