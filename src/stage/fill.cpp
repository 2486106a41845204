#include "stage/fill.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstring>

#include "format/convert.h"
#include "format/dtype.h"

namespace tsnap::stage {
namespace {

struct Piece {
  size_t tensor;   // index into file.tensors
  uint64_t elem0;  // first stored element
  uint64_t count;  // elements
  uint64_t dst;    // offset in the chunk buffer
};

}  // namespace

Sources prepare_sources(const plan::PlannedFile& file) {
  at::NoGradGuard no_grad;  // copies of the values, not part of anyone's graph
  Sources out;
  out.tensors.reserve(file.tensors.size());
  for (const plan::PlannedTensor& t : file.tensors) {
    at::Tensor src = t.source;
    if (!src.device().is_cpu()) {
      // Convert on the device (one pass there); slices go to the host chunk by chunk.
      src = src.to(t.dtype).contiguous();
      const c10::Device device = src.device();
      const bool seen = std::any_of(out.ready.begin(), out.ready.end(),
                                    [&](const auto& r) { return r.first == device; });
      if (!seen) out.ready.emplace_back(device, nullptr);
    } else if (!src.is_contiguous()) {
      src = src.contiguous();
    }
    out.tensors.push_back(std::move(src));
  }
  // Side streams must see the values as of now: an event after the work queued so far.
  for (auto& [device, event] : out.ready) {
    c10::impl::VirtualGuardImpl impl(device.type());
    event = std::make_shared<c10::Event>(device.type());
    event->record(impl.getStream(device));
  }
  return out;
}

uint64_t fill_chunk(const plan::PlannedFile& file, const Sources& sources, uint64_t chunk,
                    uint8_t* buf) {
  const uint64_t lo = file.chunk_begin(chunk);
  const uint64_t hi = file.chunk_end(chunk);
  if (lo < file.data_offset) {
    std::memcpy(buf, file.header.data() + lo, std::min(hi, file.data_offset) - lo);
  }

  // Tensors overlapping [lo, hi): the first is the one whose end lies beyond lo.
  auto first =
      std::upper_bound(file.tensors.begin(), file.tensors.end(), lo,
                       [](uint64_t off, const plan::PlannedTensor& t) { return off < t.end; });
  std::vector<Piece> pieces;
  for (auto it = first; it != file.tensors.end() && it->begin < hi; ++it) {
    const uint64_t a = std::max(lo, it->begin);
    const uint64_t b = std::min(hi, it->end);
    if (a >= b) continue;
    const uint64_t esz = format::element_size(it->dtype);
    const uint64_t per_piece = std::max<uint64_t>(1, kPieceBytes / esz);
    const uint64_t e_begin = (a - it->begin) / esz;
    const uint64_t e_end = (b - it->begin) / esz;
    for (uint64_t e = e_begin; e < e_end; e += per_piece) {
      const uint64_t n = std::min(per_piece, e_end - e);
      pieces.push_back(
          {static_cast<size_t>(it - file.tensors.begin()), e, n, it->begin + e * esz - lo});
    }
  }

  // Device pieces: queue non-blocking copies on a side stream per device, wait at the end.
  at::NoGradGuard no_grad;
  std::vector<c10::Stream> streams;
  const auto wait_streams = [&streams] {
    for (const c10::Stream& s : streams) {
      c10::impl::VirtualGuardImpl(s.device_type()).synchronizeStream(s);
    }
  };
  try {
    for (const Piece& p : pieces) {
      const at::Tensor& src = sources.tensors[p.tensor];
      if (src.device().is_cpu()) continue;
      const c10::Device device = src.device();
      c10::impl::VirtualGuardImpl impl(device.type());
      auto it = std::find_if(streams.begin(), streams.end(),
                             [&](const c10::Stream& s) { return s.device() == device; });
      if (it == streams.end()) {
        streams.push_back(impl.getStreamFromGlobalPool(device));
        it = streams.end() - 1;
        for (const auto& [d, event] : sources.ready) {
          if (d == device) event->block(*it);
        }
      }
      c10::StreamGuard guard(*it);
      at::Tensor host = at::from_blob(buf + p.dst, {static_cast<int64_t>(p.count)},
                                      at::TensorOptions().dtype(file.tensors[p.tensor].dtype));
      host.copy_(
          src.reshape({-1}).narrow(0, static_cast<int64_t>(p.elem0), static_cast<int64_t>(p.count)),
          /*non_blocking=*/true);
    }
  } catch (...) {
    // The copies queued so far write into buf, which the caller reuses once this throws.
    try {
      wait_streams();
    } catch (...) {
    }
    throw;
  }

  tbb::parallel_for(size_t{0}, pieces.size(), [&](size_t i) {
    const Piece& p = pieces[i];
    const at::Tensor& src = sources.tensors[p.tensor];
    if (!src.device().is_cpu()) return;
    const auto* base = static_cast<const uint8_t*>(src.data_ptr());
    format::convert(base + p.elem0 * src.element_size(), src.scalar_type(), buf + p.dst,
                    file.tensors[p.tensor].dtype, p.count);
  });

  wait_streams();
  return hi - lo;
}

}  // namespace tsnap::stage
