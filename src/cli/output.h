#pragma once
// Text output helpers shared by the subcommands: aligned tables and human-readable figures
// (the tables and byte counts live in common/text_table.h, shared with the benchmarks).

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "common/shape.h"
#include "common/text_table.h"

namespace tsnap::cli {

/// "512 B", "1.5 KiB", "297.3 MiB", ... (binary units, one decimal above bytes).
using detail::human_bytes;
/// "[768, 2304]"; "[]" for a scalar.
using detail::shape_string;
/// The dtype's name in the format ("F32", "BF16", ...), as MANIFEST.json and the shards spell it.
std::string dtype_string(at::ScalarType t);
/// Local time "YYYY-MM-DD HH:MM:SS" of a Unix time in nanoseconds.
std::string local_time(int64_t unix_ns);
/// `message` without a leading "tsnap: " (library messages carry it; the tool adds its own).
std::string plain_message(const std::string& message);
using detail::count_of;

/// Size of the MANIFEST.json of `snapshot` (0 if it cannot be read).
uint64_t manifest_bytes(const std::filesystem::path& snapshot);

/// An aligned text table (common/text_table.h).
using detail::Table;

}  // namespace tsnap::cli
