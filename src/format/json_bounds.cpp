#include "format/json_bounds.h"

#include <stdexcept>
#include <utility>
#include <vector>

namespace tsnap::format {

std::string json_bounds_problem(std::string_view text, size_t max_depth) {
  size_t depth = 0;
  size_t values = 1;
  bool in_string = false;
  bool escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (ch == '\0') return "a NUL byte at offset " + std::to_string(i);
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (ch == '\\') {
        escaped = true;
      } else if (ch == '"') {
        in_string = false;
      }
      continue;
    }
    switch (ch) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (++depth > max_depth) {
          return "nesting deeper than " + std::to_string(max_depth) + " levels at offset " +
                 std::to_string(i);
        }
        ++values;
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      case ',':
        if (++values > kMaxJsonValues) {
          return "more than " + std::to_string(kMaxJsonValues) + " values";
        }
        break;
      default:
        break;
    }
  }
  return "";
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
