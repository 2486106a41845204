#pragma once
// MANIFEST.json serialisation and validation (docs/format.md, "Manifest").

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "format/json_bounds.h"
#include "tsnap/manifest.h"

namespace tsnap::format {

/// Largest MANIFEST.json read_manifest accepts (256 MiB: about 700,000 tensors), so a hostile
/// file cannot exhaust memory; with the bounds of format/json_bounds.h its DOM stays under ~1 GiB.
inline constexpr uint64_t kMaxManifestBytes = 256ull << 20;

/// Throws InvalidArgument unless user `metadata` can be written and read back: valid UTF-8
/// strings, nesting within the reader's bound once under the manifest's "metadata" key, and
/// a serialised size within kMaxManifestBytes. Saves call it before anything is written.
void check_metadata_writable(const nlohmann::json& metadata);

/// Throws InvalidArgument when `text`, a manifest about to be committed, breaks a bound that
/// read_manifest enforces (size, nesting, values, NUL): the writer never commits what its own
/// reader rejects.
void check_manifest_readable(std::string_view text);

struct SnapshotDir;

/// The exact bytes of the MANIFEST.json of `dir` (opened relative to it). Errors: as
/// tsnap::read_manifest, but for parsing.
std::string manifest_text_in(const SnapshotDir& dir);
/// Reads and parses the MANIFEST.json of `dir` (opened relative to it). Errors: as
/// tsnap::read_manifest.
Manifest read_manifest_in(const SnapshotDir& dir);

/// The manifest's fields other than files, tensors and weight_map (format, versions, id,
/// times, world size, metadata) as a JSON object: the head that `tsnap inspect` shows too.
nlohmann::json manifest_header_json(const Manifest& m);

/// The format version a writer records for `m`: kFormatVersion (3, whose manifests must carry
/// their checksum, docs/format.md section 7).
int written_version(const Manifest& m);

/// The manifest as JSON (deterministic field order, tensors sorted by name).
/// Errors: InvalidArgument for duplicate tensor or file names, an unsupported dtype or metadata
/// that is not a JSON object.
nlohmann::json manifest_to_json(const Manifest& m);

/// The values of a manifest's "tensors" and "weight_map" members as manifest_to_text writes
/// them: most of its text for many tensors, and known from the tensor records alone, so that a
/// writer can render them while its chunks are being written (the file records, with their
/// hashes, only at the end). Errors: those of manifest_to_text about tensors.
struct ManifestTensorText {
  std::string tensors;
  std::string weight_map;
  /// Their bounds (json_bounds.h), once scan_bounds has run: readable_manifest_text then
  /// checks the rest of the manifest only.
  std::optional<JsonBounds> tensors_bounds;
  std::optional<JsonBounds> weight_map_bounds;
};
ManifestTensorText manifest_tensor_text(const Manifest& m);
/// Sets text.tensors_bounds and text.weight_map_bounds.
void scan_bounds(ManifestTensorText& text);

/// The same JSON as manifest_to_json(m), written directly as text: compact, one line per file,
/// tensor and weight_map entry, ending in a newline. Same errors as manifest_to_json, plus
/// InvalidArgument for a name that is not UTF-8. Much faster for many tensors. With
/// `tensor_text` (manifest_tensor_text of the same tensor records), m.tensors is not read.
std::string manifest_to_text(const Manifest& m, const ManifestTensorText* tensor_text = nullptr);

/// manifest_to_text, for a manifest about to be committed: throws as check_manifest_readable
/// does when the text breaks a bound that readers enforce, without scanning the parts of
/// `tensor_text` that scan_bounds has scanned already.
std::string readable_manifest_text(const Manifest& m,
                                   const ManifestTensorText* tensor_text = nullptr);

/// Parses and validates manifest text. `label` names the file in errors. Checks: JSON object,
/// format == "tsnap" and version <= kFormatVersion (else kUnsupportedFormat), required fields and
/// types, file names are plain relative names inside the directory (kUnsafePath), tensor ranges
/// lie inside their file with dtype*shape == byte length and no overlaps (kBadOffsets), chunk
/// hash count matches size/chunk_bytes, weight_map agrees with tensors (kBadManifest).
Manifest parse_manifest(std::string_view text, const std::string& label);

}  // namespace tsnap::format
