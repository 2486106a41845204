#include "format/json_bounds.h"

#include <stdexcept>
#include <utility>
#include <vector>

namespace tsnap::format {

void JsonBounds::scan(std::string_view text) {
  if (!problem_.empty()) return;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (ch == '\0') {
      nul_ = true;
      nul_at_ = offset_ + i;
      problem_ = "a NUL byte at offset " + std::to_string(nul_at_);
      return;
    }
    if (in_string_) {
      if (escaped_) {
        escaped_ = false;
      } else if (ch == '\\') {
        escaped_ = true;
      } else if (ch == '"') {
        in_string_ = false;
      }
      continue;
    }
    switch (ch) {
      case '"':
        in_string_ = true;
        break;
      case '[':
      case '{':
        if (++depth_ > first_at_.size()) first_at_.push_back(offset_ + i);
        if (depth_ > max_depth_) {
          problem_ = too_deep(offset_ + i);
          return;
        }
        ++values_;
        break;
      case ']':
      case '}':
        if (depth_ > 0) --depth_;
        break;
      case ',':
        if (++values_ > kMaxJsonValues) {
          problem_ = "more than " + std::to_string(kMaxJsonValues) + " values";
          return;
        }
        break;
      default:
        break;
    }
  }
  offset_ += text.size();
}

std::string JsonBounds::too_deep(size_t offset) const {
  return "nesting deeper than " + std::to_string(max_depth_) + " levels at offset " +
         std::to_string(offset);
}

void JsonBounds::add(const JsonBounds& value) {
  if (!problem_.empty()) return;
  if (in_string_) {
    problem_ = "a part at offset " + std::to_string(offset_) + " is inside a string";
    return;
  }
  // The depths the part reaches, from here: the first beyond the bound is the whole scan's
  // problem, wherever the part's own scan stopped (it stopped at its first problem, and
  // recorded every depth it reached before).
  for (size_t level = 1; level <= value.first_at_.size(); ++level) {
    if (depth_ + level <= first_at_.size()) continue;
    first_at_.push_back(offset_ + value.first_at_[level - 1]);
    if (depth_ + level > max_depth_) {
      problem_ = too_deep(first_at_.back());
      return;
    }
  }
  if (!value.problem_.empty()) {
    // A NUL byte, or more values than any document may hold, within the part.
    if (value.nul_) {
      nul_ = true;
      nul_at_ = offset_ + value.nul_at_;
      problem_ = "a NUL byte at offset " + std::to_string(nul_at_);
    } else {
      problem_ = value.problem_;
    }
    return;
  }
  if (value.depth_ != 0 || value.in_string_) {
    problem_ = "a part at offset " + std::to_string(offset_) + " is not a whole value";
    return;
  }
  values_ += value.values_ - 1;
  if (values_ > kMaxJsonValues) {
    problem_ = "more than " + std::to_string(kMaxJsonValues) + " values";
    return;
  }
  offset_ += value.offset_;
}

std::string json_bounds_problem(std::string_view text, size_t max_depth) {
  JsonBounds bounds(max_depth);
  bounds.scan(text);
  return bounds.problem();
}

nlohmann::json parse_bounded_json(std::string_view text) {
  const std::string problem = json_bounds_problem(text);
  if (!problem.empty()) throw std::invalid_argument(problem);
  return nlohmann::json::parse(text);
}

size_t json_depth(const nlohmann::json& value) {
  size_t deepest = 0;
  std::vector<std::pair<const nlohmann::json*, size_t>> stack{{&value, 0}};
  while (!stack.empty()) {
    const auto [v, depth] = stack.back();
    stack.pop_back();
    if (!v->is_structured()) continue;
    deepest = std::max(deepest, depth + 1);
    for (const nlohmann::json& child : *v) stack.emplace_back(&child, depth + 1);
  }
  return deepest;
}

}  // namespace tsnap::format
