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
      problem_ = "a NUL byte at offset " + std::to_string(offset_ + i);
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
        if (++depth_ > max_depth_) {
          problem_ = "nesting deeper than " + std::to_string(max_depth_) + " levels at offset " +
                     std::to_string(offset_ + i);
          return;
        }
        if (depth_ > deepest_) {
          deepest_ = depth_;
          deepest_at_ = offset_ + i;
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

void JsonBounds::add(const JsonBounds& value) {
  if (!problem_.empty()) return;
  if (!value.problem_.empty()) {
    problem_ = value.problem_ + " of a part at offset " + std::to_string(offset_);
    return;
  }
  if (value.depth_ != 0 || value.in_string_) {
    problem_ = "a part at offset " + std::to_string(offset_) + " is not a whole value";
    return;
  }
  if (depth_ + value.deepest_ > max_depth_) {
    problem_ = "nesting deeper than " + std::to_string(max_depth_) + " levels at offset " +
               std::to_string(offset_ + value.deepest_at_);
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
