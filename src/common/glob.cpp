#include "common/glob.h"

#include <algorithm>
#include <cstddef>
#include <utility>

#include "tsnap/error.h"

namespace tsnap::detail {
namespace {

// One element of a parsed pattern.
struct Token {
  enum Kind { kChar, kAny, kStar, kClass };
  explicit Token(Kind k, char ch = 0) : kind(k), c(ch) {}

  Kind kind;
  char c = 0;                                 // kChar
  bool negated = false;                       // kClass
  std::vector<std::pair<char, char>> ranges;  // kClass: inclusive ranges

  bool matches(char x) const {
    switch (kind) {
      case kChar:
        return x == c;
      case kAny:
        return true;
      case kClass: {
        bool in = false;
        for (const auto& [lo, hi] : ranges) in = in || (lo <= x && x <= hi);
        return in != negated;
      }
      case kStar:
        break;
    }
    return false;
  }
};

[[noreturn]] void bad_pattern(std::string_view pattern, const char* why) {
  throw_error(ErrorCode::kInvalidArgument,
              "bad glob pattern '" + std::string(pattern) + "': " + why);
}

std::vector<Token> parse(std::string_view p) {
  std::vector<Token> tokens;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '*') {
      if (tokens.empty() || tokens.back().kind != Token::kStar) tokens.emplace_back(Token::kStar);
    } else if (c == '?') {
      tokens.emplace_back(Token::kAny);
    } else if (c == '\\') {
      if (++i == p.size()) bad_pattern(p, "ends in a lone '\\'");
      tokens.emplace_back(Token::kChar, p[i]);
    } else if (c == '[') {
      Token t(Token::kClass);
      size_t j = i + 1;
      if (j < p.size() && (p[j] == '!' || p[j] == '^')) t.negated = true, ++j;
      const size_t first = j;
      for (; j < p.size() && (p[j] != ']' || j == first); ++j) {
        if (j + 2 < p.size() && p[j + 1] == '-' && p[j + 2] != ']') {
          t.ranges.emplace_back(p[j], p[j + 2]);
          j += 2;
        } else {
          t.ranges.emplace_back(p[j], p[j]);
        }
      }
      if (j >= p.size()) bad_pattern(p, "'[' is never closed");
      tokens.push_back(std::move(t));
      i = j;
    } else {
      tokens.emplace_back(Token::kChar, c);
    }
  }
  return tokens;
}

bool match(const std::vector<Token>& tokens, std::string_view text) {
  // Greedy matching that backtracks to the last '*' only: each '*' absorbs one more character
  // per retry, which is enough because a later '*' can absorb whatever an earlier one would.
  size_t t = 0, s = 0;
  size_t star = tokens.size(), star_s = 0;
  while (s < text.size()) {
    if (t < tokens.size() && tokens[t].kind == Token::kStar) {
      star = t++;
      star_s = s;
    } else if (t < tokens.size() && tokens[t].matches(text[s])) {
      ++t, ++s;
    } else if (star != tokens.size()) {
      t = star + 1;
      s = ++star_s;
    } else {
      return false;
    }
  }
  while (t < tokens.size() && tokens[t].kind == Token::kStar) ++t;
  return t == tokens.size();
}

}  // namespace

bool glob_match(std::string_view pattern, std::string_view text) {
  return match(parse(pattern), text);
}

std::vector<std::string> select_keys(const std::vector<std::string>& keys,
                                     const std::vector<std::string>& include,
                                     const std::vector<std::string>& exclude, bool strict) {
  if (!include.empty() && !exclude.empty()) {
    throw_error(ErrorCode::kInvalidArgument, "give include or exclude patterns, not both");
  }
  const bool including = !include.empty();
  const auto& patterns = including ? include : exclude;
  std::vector<std::vector<Token>> parsed;
  parsed.reserve(patterns.size());
  for (const auto& p : patterns) parsed.push_back(parse(p));

  std::vector<bool> used(patterns.size(), false);
  std::vector<std::string> selected;
  for (const auto& key : keys) {
    bool hit = false;
    for (size_t i = 0; i < parsed.size(); ++i) {
      if (match(parsed[i], key)) hit = used[i] = true;
    }
    if (hit == including) selected.push_back(key);
  }
  if (strict) {
    for (size_t i = 0; i < patterns.size(); ++i) {
      if (!used[i]) {
        throw_error(ErrorCode::kKeyNotFound, std::string(including ? "include" : "exclude") +
                                                 " pattern '" + patterns[i] + "' matches no key" +
                                                 near_keys_note(patterns[i], keys));
      }
    }
  }
  return selected;
}

namespace {

// Levenshtein distance, capped: returns `cap` + 1 once it must exceed `cap`.
size_t distance(std::string_view a, std::string_view b, size_t cap) {
  if (a.size() > b.size() + cap || b.size() > a.size() + cap) return cap + 1;
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    size_t best = row[0];
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
      best = std::min(best, row[j]);
    }
    if (best > cap) return cap + 1;
  }
  return row[b.size()];
}

}  // namespace

std::string near_keys_note(const std::string& wanted, const std::vector<std::string>& keys) {
  constexpr size_t kScan = 200000;  // an error path: bounded work on huge key sets
  constexpr size_t kShow = 3;
  // The checkpoint prefix confusion first: "fc1.weight" wanted, "model/fc1.weight" stored.
  std::vector<std::string> prefixed;
  std::vector<std::pair<size_t, std::string>> near;
  const size_t cap = std::max<size_t>(2, wanted.size() / 4);
  bool is_pattern = wanted.find_first_of("*?[\\") != std::string::npos;
  std::vector<Token> suffix;
  try {
    suffix = parse("*/" + wanted);
  } catch (const Error&) {
  }
  for (size_t i = 0; i < keys.size() && i < kScan; ++i) {
    const std::string& k = keys[i];
    if (!suffix.empty() && match(suffix, k)) {
      if (prefixed.size() < kShow) prefixed.push_back(k);
      continue;
    }
    if (is_pattern) continue;
    const size_t d = distance(wanted, k, cap);
    if (d <= cap) near.emplace_back(d, k);
  }
  std::string note;
  if (!prefixed.empty()) {
    note = "; under a prefix the snapshot has: ";
    for (size_t i = 0; i < prefixed.size(); ++i) note += (i ? ", '" : "'") + prefixed[i] + "'";
    const size_t slash = prefixed[0].find('/');
    if (slash != std::string::npos) {
      note += " (LoadOptions::key_prefix = \"" + prefixed[0].substr(0, slash + 1) +
              "\" maps keys under it)";
    }
    return note;
  }
  std::sort(near.begin(), near.end());
  for (size_t i = 0; i < near.size() && i < kShow; ++i) {
    note += (i ? ", '" : "; nearest keys: '") + near[i].second + "'";
  }
  return note;
}

}  // namespace tsnap::detail
