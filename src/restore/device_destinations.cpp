#include "restore/device_destinations.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <exception>

#include "common/sys_error.h"
#include "tsnap/error.h"

namespace tsnap::restore {

bool on_device(const at::Tensor& dest) { return !dest.device().is_cpu(); }

void* DeviceDestinations::stand_in(const std::string& key, const at::Tensor& dest) {
  at::Tensor host;
  try {
    // Pinned memory makes the copy to a CUDA device asynchronous (and twice as fast as from
    // pageable memory).
    host = at::empty(
        dest.sizes(),
        at::TensorOptions().dtype(dest.scalar_type()).pinned_memory(dest.device().is_cuda()));
  } catch (const std::exception& e) {
    throw_error(ErrorCode::kUnsupported, "cannot allocate a host buffer for destination '" + key +
                                             "' on " + dest.device().str() + " (" +
                                             std::to_string(dest.nbytes()) +
                                             " bytes): " + detail::first_line(e.what()));
  }
  pending_.push_back({key, dest, host});
  return host.data_ptr();
}

void DeviceDestinations::copy_to_devices() {
  at::NoGradGuard no_grad;  // parameters that require grad are written in place, as on the CPU
  // One side stream per device, which first waits for what the caller queued on the device's
  // current stream (its kernels may still be writing or reading the destinations).
  std::vector<c10::Stream> streams;
  std::vector<c10::Event> events;
  events.reserve(pending_.size());
  const auto wait_all = [&streams] {
    for (const c10::Stream& s : streams) {
      c10::impl::VirtualGuardImpl(s.device_type()).synchronizeStream(s);
    }
  };
  const Pending* current = nullptr;
  try {
    for (const Pending& p : pending_) {
      current = &p;
      const c10::Device device = p.dest.device();
      auto it = std::find_if(streams.begin(), streams.end(),
                             [&](const c10::Stream& s) { return s.device() == device; });
      if (it == streams.end()) {
        c10::impl::VirtualGuardImpl impl(device.type());
        const c10::Stream side = impl.getStreamFromGlobalPool(device);
        events.emplace_back(device.type());
        events.back().record(impl.getStream(device));
        events.back().block(side);
        streams.push_back(side);
        it = streams.end() - 1;
      }
      c10::StreamGuard guard(*it);
      p.dest.copy_(p.host, /*non_blocking=*/true);
    }
    current = nullptr;
    wait_all();
  } catch (const std::exception& e) {
    const std::string what = detail::first_line(e.what());
    try {
      wait_all();  // the host buffers must outlive the copies already queued
    } catch (const std::exception&) {
    }
    throw_error(
        ErrorCode::kIo,
        (current ? "copying destination '" + current->key + "' to " + current->dest.device().str()
                 : std::string("waiting for the copies to the device destinations")) +
            " failed: " + what + "; the device destinations are undefined");
  }
}

}  // namespace tsnap::restore
