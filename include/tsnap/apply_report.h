#pragma once
/// \file
/// `tsnap::ApplyOptions` and `tsnap::ApplyReport`: how state is applied to live objects (models,
/// optimizers, random generators) and what happened, for `apply_model_state`,
/// `apply_optimizer_state` and `Checkpoint::apply`.

#include <string>
#include <vector>

#include "tsnap/export.h"

namespace tsnap {

/// Options of applying state to objects.
struct TSNAP_API ApplyOptions {
  /// Strict: any missing key, unexpected key or mismatch is an error (InvalidArgument listing all
  /// of them) and nothing is modified, because everything is checked before anything changes.
  /// Non-strict: what fits is applied and the rest is reported.
  bool strict = true;
};

/// A key present on both sides whose tensor does not fit its destination.
struct TSNAP_API Mismatch {
  std::string key;
  std::string reason;  ///< E.g. "shape [4, 3] in state, [3, 4] in object".
};

/// What an apply did. Keys are those of the state applied (`<object>/<key>` for checkpoints).
/// Value type.
struct TSNAP_API ApplyReport {
  std::vector<std::string> missing;     ///< Keys the objects need that the state lacks.
  std::vector<std::string> unexpected;  ///< Keys of the state that no object takes.
  std::vector<Mismatch> mismatched;     ///< Keys whose shape or kind of dtype does not fit.
  std::vector<std::string> applied;     ///< Keys copied into the objects.

  /// True when nothing was missing, unexpected or mismatched.
  bool ok() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }
  /// One line listing every problem ("2 missing: a, b; 1 mismatched: c (shape ...)"), or "ok".
  std::string to_string() const;
};

}  // namespace tsnap
