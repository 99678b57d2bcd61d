// GPU runtime helpers of the kernels library: the error text of a runtime error code and the
// per-device multiprocessor count and shared memory per block (queried once per device).
// Nothing here throws.
#include <atomic>

#include "primus_turbo/device.h"

namespace primus_turbo {

const char* gpu_error_string(int code) noexcept {
  return ptGetErrorString(static_cast<ptError_t>(code));
}

namespace {
// Attribute `attr` of the current device, cached per device (0 = not queried yet).
template <int kSlot>
Status cached_attribute(int attr, int* out) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices];  // same value on every race
  int dev = 0;
  PT_RETURN_IF_ERROR(ptGetDevice(&dev));
  if (dev >= 0 && dev < kMaxDevices) {
    const int n = cache[dev].load(std::memory_order_relaxed);
    if (n > 0) {
      *out = n;
      return kOk;
    }
  }
  int n = 0;
  PT_RETURN_IF_ERROR(ptDeviceGetAttribute(&n, static_cast<decltype(PT_ATTR_SM_COUNT)>(attr), dev));
  n = n > 0 ? n : 1;
  if (dev >= 0 && dev < kMaxDevices) cache[dev].store(n, std::memory_order_relaxed);
  *out = n;
  return kOk;
}
}  // namespace

Status device_sm_count(int* out) noexcept {
  return cached_attribute<0>(static_cast<int>(PT_ATTR_SM_COUNT), out);
}

Status device_max_smem_per_block(int* out) noexcept {
  return cached_attribute<1>(static_cast<int>(PT_ATTR_SMEM_PER_BLOCK), out);
}

}  // namespace primus_turbo
