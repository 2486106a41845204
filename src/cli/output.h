#pragma once
// Text output helpers shared by the subcommands: aligned tables and human-readable figures.

#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "common/shape.h"

namespace tsnap::cli {

/// "512 B", "1.5 KiB", "297.3 MiB", ... (binary units, one decimal above bytes).
std::string human_bytes(uint64_t n);
/// "[768, 2304]"; "[]" for a scalar.
using detail::shape_string;
/// The dtype's name in the format ("F32", "BF16", ...), as MANIFEST.json and the shards spell it.
std::string dtype_string(at::ScalarType t);
/// Local time "YYYY-MM-DD HH:MM:SS" of a Unix time in nanoseconds.
std::string local_time(int64_t unix_ns);
/// `message` without a leading "tsnap: " (library messages carry it; the tool adds its own).
std::string plain_message(const std::string& message);
/// "1 file", "3 files".
std::string count_of(uint64_t n, const std::string& singular, const std::string& plural);

/// A text table: a header row, then rows, columns separated by two spaces and padded to the
/// widest cell. Columns marked numeric are right-aligned.
class Table {
 public:
  explicit Table(std::vector<std::string> headers);
  /// Right-aligns column `column`.
  void set_numeric(size_t column);
  /// Adds a row; it must have one cell per header.
  void add_row(std::vector<std::string> cells);
  bool empty() const { return rows_.empty(); }
  void print(std::ostream& out) const;

 private:
  std::vector<std::string> headers_;
  std::vector<bool> numeric_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace tsnap::cli
