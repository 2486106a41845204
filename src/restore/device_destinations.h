#pragma once
// Destinations of a load_into that live on a device (CUDA, ...): the reads cannot write them,
// so each gets a host stand-in (a contiguous tensor of its shape and dtype, in pinned memory
// for a CUDA device) that the reads fill and verify as they would a CPU destination. Once every
// read has succeeded, the stand-ins are copied to their devices with non-blocking copies on a
// side stream of each device, ordered after the work the caller had queued on that device's
// current stream (an event), and the call waits for those copies: when load_into returns, the
// destinations hold the snapshot's values, for any stream. A failed read leaves every device
// destination as it was.

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace tsnap::restore {

/// Whether a load_into destination lives on a device that the reads cannot write directly
/// (anything but the CPU).
bool on_device(const at::Tensor& dest);

/// The host stand-ins of one load_into's device destinations. Not thread-safe; one per call.
class DeviceDestinations {
 public:
  /// A new host tensor for `dest` (a strided tensor on a device; `key` names it in errors):
  /// contiguous, of dest's shape and dtype, in pinned memory when dest is a CUDA tensor. The
  /// caller reads into it; copy_to_devices copies it to `dest`. Errors: Error(kUnsupported)
  /// naming the key when the memory cannot be allocated.
  void* stand_in(const std::string& key, const at::Tensor& dest);

  /// Copies every stand-in to its destination (see above) and waits for the copies.
  /// Errors: Error(kIo) naming the key and device when a copy fails; the destinations are then
  /// undefined.
  void copy_to_devices();

  bool empty() const { return pending_.empty(); }

 private:
  struct Pending {
    std::string key;
    at::Tensor dest;
    at::Tensor host;
  };
  std::vector<Pending> pending_;
};

}  // namespace tsnap::restore
