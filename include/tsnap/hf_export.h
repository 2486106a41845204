#pragma once
/// \file
/// Exporting a snapshot for Hugging Face: `tsnap::export_hf` writes a directory that
/// `safetensors.torch.load_file` and transformers' `from_pretrained` read without tsnap.

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tsnap/error.h"
#include "tsnap/export.h"

namespace tsnap {

/// Options of export_hf. In C++17:
/// `tsnap::HfExportOptions o; o.object = "model"; o.dtype = at::kBFloat16;`. Designated
/// initialisers need C++20 (or GCC's and Clang's extension in C++17, which -pedantic warns
/// about): `{.object = "model", .dtype = at::kBFloat16}`.
struct TSNAP_API HfExportOptions {
  /// Export only the keys of this checkpoint object: snapshot key "model/fc1.weight" is written
  /// as "fc1.weight" (LoadOptions::key_prefix with "<object>/"). Empty: every key, unchanged.
  std::string object;
  /// Convert floating tensors (f64, f32, f16, bf16) to this floating dtype; integer and bool
  /// tensors are written as stored. Unset: every tensor in its stored dtype, bit for bit.
  std::optional<at::ScalarType> dtype;
  /// Largest data size of one output file before the export is split into
  /// `model-0000i-of-0000N.safetensors` files plus `model.safetensors.index.json` (a tensor
  /// larger than this gets a file of its own). Default: 5 GB, as `save_pretrained`'s.
  uint64_t max_shard_size = 5'000'000'000ull;
  /// Replace an existing output directory (it is moved aside, the new one renamed in, and the
  /// old one removed). Otherwise an existing output is Error(kAlreadyExists).
  bool overwrite = false;
  /// Hard-link the snapshot's shard files (each a standard safetensors file) as the output
  /// files instead of writing new ones, when they can serve as they are: no `object`, no
  /// `dtype` change, no key stored as pieces, and every shard's data within `max_shard_size`.
  /// The snapshot is verified first (every chunk's hash). Linked files take no extra space and
  /// survive the snapshot's deletion; like the snapshot's, they must never be modified in
  /// place. Where links are refused (another filesystem, EPERM), the export writes copies.
  bool link = true;
};

/// What export_hf wrote.
struct TSNAP_API HfExportResult {
  std::vector<std::string> files;  ///< Names of the files in the output directory, in order.
  uint64_t total_size = 0;         ///< Bytes of tensor data (the index's metadata.total_size).
  size_t tensors = 0;              ///< Number of tensors written.
  bool linked = false;             ///< Whether the files are hard links to the snapshot's.
};

/// Writes the tensors of the snapshot at `snapshot` into a new directory `out` in the Hugging
/// Face layout: one `model.safetensors`, or, when the data exceeds `max_shard_size`,
/// `model-00001-of-0000N.safetensors` ... plus `model.safetensors.index.json`
/// (`{"metadata": {"total_size": N}, "weight_map": {key: file}}`). Each file's header carries
/// `{"__metadata__": {"format": "pt"}}`. Keys are split over files in key order. The snapshot
/// is read with tsnap::load (every chunk verified, distributed pieces assembled) and held in
/// memory once; or, where `link` allows, its shard files are verified and hard-linked, keeping
/// tsnap's split (and its `__metadata__`, which also has "format": "pt"). The files are written
/// into a temporary directory next to `out`
/// (".<out name>.hf-tmp-<id>"), each fsynced, and the directory is renamed to `out` at the end,
/// so `out` never exists half-written.
/// Errors: those of tsnap::load; Error(kAlreadyExists) when `out` exists and not overwrite;
/// InvalidArgument(kKeyNotFound) when `object` has no keys (naming the objects there are);
/// InvalidArgument for a non-floating `dtype`, for an `out` that is, lies inside or holds the
/// snapshot, and for a checkpoint of several objects (every key "<object>/...") exported
/// without `object` (naming the objects); Error(kUnsupported) for a key stored only as
/// pieces that do not cover it; IoError naming the file for a failed write, fsync or rename
/// (the temporary directory is removed). Thread-safe (calls are independent; two calls must
/// not write the same `out`). Ownership: nothing is kept after the call.
TSNAP_API HfExportResult export_hf(const std::filesystem::path& snapshot,
                                   const std::filesystem::path& out,
                                   const HfExportOptions& options = {});

}  // namespace tsnap
