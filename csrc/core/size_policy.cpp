// size_policy.cpp — rounding (see size_policy.h for the table).
#include "size_policy.h"

namespace amem {

size_t roundup_power2_next_division(size_t size, size_t divisions) {
  if ((size & (size - 1)) == 0) return size;                  // already a power of two
  size_t floor_pow2 = size_t{1} << (63 - __builtin_clzll(size));
  size_t step = floor_pow2 >> (63 - __builtin_clzll(divisions));
  if (step == 0) return floor_pow2 << 1;                      // more divisions than bytes
  size_t rounded_down = size & ~(step - 1);
  return rounded_down == size ? size : rounded_down + step;
}

}  // namespace amem
