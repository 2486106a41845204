#pragma once
// Helpers shared by the test suites: temporary directories, test states, bitwise comparison.

#include <ATen/ATen.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tsnap/state_dict.h"

namespace tsnap::test_support {

/// A fresh directory under `base` (default: the system temp dir), removed on destruction.
class TempDir {
 public:
  explicit TempDir(const std::filesystem::path& base = std::filesystem::temp_directory_path());
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

/// True when `a` and `b` have the same dtype, shape and bytes.
bool bitwise_equal(const at::Tensor& a, const at::Tensor& b);

/// A tensor of `dtype` and `shape` with varied, deterministic values (seeded).
at::Tensor make_tensor(at::ScalarType dtype, at::IntArrayRef shape, uint64_t seed);

/// A state of every supported dtype and awkward shapes: 0-d, empty, odd sizes.
StateDict mixed_state(uint64_t seed = 1);

/// A fine-tuning state after `step` steps (incremental saves): a frozen backbone of 1.2 MB that
/// never changes, a trained head, its optimizer moment and a step counter that change every
/// step, and from step 5 on a new buffer.
StateDict fine_tuning_state(int step);

/// The names of the entries of a directory (files and folders), sorted.
std::vector<std::string> dir_entries(const std::filesystem::path& dir);

/// `manifest` (without a "checksum" member) as the text a writer commits: dumped, with its
/// checksum appended as the last member (docs/format.md), so that a test can edit a manifest
/// and have only the checks of what it edited object.
std::string signed_manifest_text(nlohmann::json manifest);

/// Flips one byte of a file at `offset`.
void flip_byte(const std::filesystem::path& file, uint64_t offset);

/// What the independent safetensors reader (tests/format/safetensors_reader.py) said.
struct ReaderRun {
  int status = -1;     ///< Exit status of the reader.
  std::string output;  ///< Its stdout and stderr.
};

/// Runs the reference reader on `file` (with `tsnap_rules`: also tsnap's layout rules).
ReaderRun run_reference_reader(const std::filesystem::path& file, bool tsnap_rules = true);

/// Whether python3 (with json and struct) is there to run it.
bool have_python();

}  // namespace tsnap::test_support
