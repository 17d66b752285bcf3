// device_limit.cpp — see device_limit.h.
#include "device_limit.h"

#include <stdexcept>

namespace amem {

void DeviceLimit::set_fraction(double fraction) {
  if (!(fraction >= 0.0 && fraction <= 1.0))
    throw std::invalid_argument("amem: memory fraction " + std::to_string(fraction) +
                                " is outside [0, 1]; pass the share of device memory to allow");
  const size_t total = upstream_.memory_info().total_bytes;
  allowed_ = static_cast<size_t>(fraction * static_cast<double>(total));
  capped_ = true;
}

}  // namespace amem
