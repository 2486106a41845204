#pragma once
// MANIFEST.json serialisation and validation (docs/format.md, "Manifest").

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "tsnap/manifest.h"

namespace tsnap::format {

/// Largest MANIFEST.json read_manifest accepts (1 GiB), so a hostile file cannot exhaust memory.
inline constexpr uint64_t kMaxManifestBytes = 1ull << 30;

/// The manifest as JSON (deterministic field order, tensors sorted by name).
/// Errors: InvalidArgument for duplicate tensor or file names, an unsupported dtype or metadata
/// that is not a JSON object.
nlohmann::json manifest_to_json(const Manifest& m);

/// The same JSON as manifest_to_json(m), written directly as text: compact, one line per file,
/// tensor and weight_map entry, ending in a newline. Same errors as manifest_to_json, plus
/// InvalidArgument for a name that is not UTF-8. Much faster for many tensors.
std::string manifest_to_text(const Manifest& m);

/// Parses and validates manifest text. `label` names the file in errors. Checks: JSON object,
/// format == "tsnap" and version <= kFormatVersion (else kUnsupportedFormat), required fields and
/// types, file names are plain relative names inside the directory (kUnsafePath), tensor ranges
/// lie inside their file with dtype*shape == byte length and no overlaps (kBadOffsets), chunk
/// hash count matches size/chunk_bytes, weight_map agrees with tensors (kBadManifest).
Manifest parse_manifest(std::string_view text, const std::string& label);

}  // namespace tsnap::format
