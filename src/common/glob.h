#pragma once
// Shell-style glob patterns over state-dict keys (model_state, LoadOptions::include/exclude).

#include <string>
#include <string_view>
#include <vector>

namespace tsnap::detail {

/// Whether `text` matches the whole of `pattern`. Syntax: `*` any run of characters (including
/// '.' and '/'), `?` any one character, `[abc]`, `[a-z]`, `[!x]` (or `[^x]`) one character of (not
/// of) a set, a `]` right after `[` or `[!` is literal, and `\c` the character `c` literally.
/// Errors: InvalidArgument naming the pattern if a `[` is never closed or it ends in a lone `\`.
/// Thread-safe; linear space, O(|pattern| * |text|) time in the worst case.
bool glob_match(std::string_view pattern, std::string_view text);

/// The keys (in their order) selected by glob patterns: those matching any `include` pattern when
/// include is given, else those matching no `exclude` pattern (both empty: every key).
/// `strict` makes a pattern that matches no key an error.
/// Errors: InvalidArgument if both include and exclude are given or a pattern is malformed;
/// InvalidArgument(kKeyNotFound) naming the pattern under `strict`. Thread-safe.
std::vector<std::string> select_keys(const std::vector<std::string>& keys,
                                     const std::vector<std::string>& include,
                                     const std::vector<std::string>& exclude, bool strict);

/// A hint for an error about `wanted` (a key or a pattern) that no key matches: the keys that
/// hold it under a prefix ("model/fc1.weight" for "fc1.weight"), else up to three keys nearest
/// in edit distance; "" when there are none. Starts with "; ". Thread-safe.
std::string near_keys_note(const std::string& wanted, const std::vector<std::string>& keys);

}  // namespace tsnap::detail
