#include "common/shape.h"

namespace tsnap::detail {

std::string shape_string(c10::ArrayRef<int64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i == kMaxShownDims) {
      out += ", ...";
      break;
    }
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

}  // namespace tsnap::detail
