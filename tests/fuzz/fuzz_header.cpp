// Fuzz target: a safetensors shard header parsed from bytes (format/safetensors.h). The input
// is a whole shard file. A header the parser accepts must survive the writer: build_header of
// what was parsed is accepted again and describes the same tensors.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>

#include "format/safetensors.h"
#include "fuzz_util.h"

namespace tsnap::fuzz {
namespace {

bool same_tensors(const format::Header& a, const format::Header& b) {
  if (a.tensors.size() != b.tensors.size() || a.metadata != b.metadata) return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const format::HeaderTensor& x = a.tensors[i];
    const format::HeaderTensor& y = b.tensors[i];
    if (std::tie(x.name, x.dtype, x.shape, x.begin, x.end) !=
        std::tie(y.name, y.dtype, y.shape, y.begin, y.end)) {
      return false;
    }
  }
  return true;
}

}  // namespace
}  // namespace tsnap::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tsnap;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  format::Header h;
  if (!fuzz::accepts("parse_header", [&] { h = format::parse_header("fuzz", bytes, size); })) {
    return 0;
  }
  std::string built;
  if (!fuzz::accepts("build_header",
                     [&] { built = format::build_header(h.tensors, h.metadata); })) {
    return 0;  // names the writer refuses (e.g. empty)
  }
  const uint64_t data_len = size - h.data_offset;
  format::Header again;
  try {
    again = format::parse_header("rebuilt", built, built.size() + data_len);
  } catch (const std::exception& e) {
    fuzz::fail(std::string("the parser rejects build_header's output: ") + e.what());
  }
  if (!fuzz::same_tensors(h, again)) fuzz::fail("build_header changed the tensors");
  return 0;
}
