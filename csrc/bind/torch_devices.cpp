// torch_devices.cpp — see torch_devices.h.
#include "torch_devices.h"

#include "libc10.h"

namespace amem {

DeviceSwitchFns torch_device_switch() {
  DeviceSwitchFns fns;
  fns.exchange = reinterpret_cast<int8_t (*)(int8_t)>(
      torch_library_symbol("libc10_cuda.so", "_ZN3c104cuda14ExchangeDeviceEa"));
  fns.maybe_set = reinterpret_cast<int (*)(int8_t)>(
      torch_library_symbol("libc10_cuda.so", "_ZN3c104cuda14MaybeSetDeviceEa"));
  if (fns.exchange == nullptr || fns.maybe_set == nullptr) return {};  // both or neither
  return fns;
}

}  // namespace amem
