#include "plan/sample_hash.h"

#include <cstring>
#include <vector>

#include "format/hash.h"

namespace tsnap::plan {

std::optional<uint64_t> sample_hash(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() || t.layout() != at::kStrided || !t.is_contiguous()) {
    return std::nullopt;
  }
  const auto bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
  std::vector<uint8_t> buf;
  const auto put = [&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    buf.insert(buf.end(), b, b + n);
  };
  const auto dtype = static_cast<int32_t>(t.scalar_type());
  put(&dtype, sizeof dtype);
  for (const int64_t d : t.sizes()) put(&d, sizeof d);
  const auto* data = static_cast<const uint8_t*>(t.data_ptr());
  if (bytes <= kSampleBlocks * kSampleBlockBytes) {
    if (bytes > 0) put(data, bytes);
  } else {
    const uint64_t stride = (bytes - kSampleBlockBytes) / (kSampleBlocks - 1);
    for (uint64_t k = 0; k < kSampleBlocks; ++k) put(data + k * stride, kSampleBlockBytes);
  }
  return format::hash64(buf.data(), buf.size());
}

}  // namespace tsnap::plan
