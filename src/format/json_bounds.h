#pragma once
// Bounds on the JSON documents tsnap reads (manifests, shard headers, user metadata), checked
// by a linear scan before a DOM is built, so that a hostile file cannot exhaust the stack (deep
// nesting: copies and dumps of the DOM recurse) or memory (a DOM costs up to ~90 bytes per
// input byte for `[[[[...`, and ~16-80 bytes per value otherwise), and a NUL byte (where
// nlohmann's parser stops reading) cannot hide junk after a valid document.
//
// Limits: nesting depth 64 (the format's own fields use 4; user metadata, under the manifest's
// "metadata", gets the rest) and 16 Mi values per document (about 1 GiB of DOM at most).

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace tsnap::format {

/// Deepest nesting of arrays/objects in a document tsnap reads or writes.
inline constexpr size_t kMaxJsonDepth = 64;
/// Most values (scalars, arrays, objects, members) in a document tsnap reads or writes.
inline constexpr size_t kMaxJsonValues = size_t{16} << 20;

/// What is wrong with `text` as a bounded JSON document ("" when the bounds hold): a NUL byte,
/// nesting deeper than `max_depth`, or more than kMaxJsonValues values. Does not check syntax.
std::string json_bounds_problem(std::string_view text, size_t max_depth = kMaxJsonDepth);

/// json_bounds_problem of a document scanned piece by piece, in order. A piece that is a whole
/// JSON value (an object, an array) can be scanned apart, where it is made, and added where it
/// goes: a writer checks a large document without scanning the parts it rendered earlier again.
/// Offsets in problems count from the start of the document.
class JsonBounds {
 public:
  explicit JsonBounds(size_t max_depth = kMaxJsonDepth) : max_depth_(max_depth) {}
  /// The next bytes of the document. Stops at the first problem.
  void scan(std::string_view text);
  /// The next bytes of the document are those of `value`, a whole value scanned apart (with
  /// the same bound or a looser one), outside a string. The problem is then the one a scan of
  /// the whole document would name, at the same offset.
  void add(const JsonBounds& value);
  /// "" while the bounds hold.
  const std::string& problem() const { return problem_; }

 private:
  size_t max_depth_;
  size_t depth_ = 0;
  size_t values_ = 1;  // the document itself
  bool in_string_ = false;
  bool escaped_ = false;
  size_t offset_ = 0;  // bytes scanned so far
  // Where each depth was first reached: first_at_[d - 1] for depth d (so the size is the
  // deepest level so far), to place a problem that a part added at some depth would raise.
  std::vector<size_t> first_at_;
  std::string problem_;
  bool nul_ = false;  // the problem is a NUL byte, at nul_at_
  size_t nul_at_ = 0;
  std::string too_deep(size_t offset) const;
};

/// Parses `text` within the bounds; throws std::invalid_argument naming the broken bound, or
/// nlohmann's parse_error for bad syntax.
nlohmann::json parse_bounded_json(std::string_view text);

/// Nesting depth of `value` (a scalar is 0, `[]` 1), counted without recursion.
size_t json_depth(const nlohmann::json& value);

}  // namespace tsnap::format
