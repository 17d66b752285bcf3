// size_policy.h — how big a block and a segment must be for a request.
//
// Design note
// -----------
// Pure functions of (request, Options), the same rules as PyTorch's native
// allocator (c10/cuda/CUDACachingAllocator.cpp: round_size,
// roundup_power2_next_division, get_allocation_size, get_free_block's
// oversize rules, should_split):
//
//   request      block size                          pool    new segment
//   < 512 B      512 B                               small   2 MiB
//   ≤ 1 MiB      next multiple of 512 B              small   2 MiB
//   ≤ 10 MiB     next multiple of 512 B              large   20 MiB
//   > 10 MiB     next multiple of 512 B              large   next multiple of 2 MiB
//
// with roundup_power2_divisions (when set for the request's interval) rounding
// to the next 1/N step of the request's power-of-two interval instead of 512 B.
// Keeping these apart from the allocator lets tests print the whole table and
// lets the replay policies share them.
#pragma once

#include <cstddef>

#include "constants.h"
#include "options.h"

namespace amem {

enum class PoolKind { kSmall = 0, kLarge = 1 };

// Round up to the next 1/`divisions` step between two powers of two
// (torch: roundup_power2_next_division).
size_t roundup_power2_next_division(size_t size, size_t divisions);

// The block size a request of `size` bytes is given (torch: round_size).
// Inline: it runs on every malloc.
inline size_t round_size(size_t size, const Options& options) {
  if (size < kMinBlockSize) return kMinBlockSize;
  const size_t divisions = options.divisions_for(size);  // <= kMaxRoundupDivisions: no overflow
  if (divisions > 1 && size > kMinBlockSize * divisions) return roundup_power2_next_division(size, divisions);
  return kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
}

// Which pool serves a rounded request (torch: get_pool).
inline PoolKind pool_for(size_t rounded) {
  return rounded <= kSmallSize ? PoolKind::kSmall : PoolKind::kLarge;
}

// The segment to ask the backend for when no cached block fits
// (torch: get_allocation_size).
inline size_t segment_size_for(size_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return kRoundLarge * ((rounded + kRoundLarge - 1) / kRoundLarge);
}

// Whether a cached block of `block_size` may serve a request of `rounded` bytes
// under the oversize rules (torch: get_free_block's max_split_size checks).
inline bool within_oversize_rules(size_t block_size, size_t rounded, const Options& options) {
  // Do not hand out an oversize block for a request that is not oversize.
  if (rounded < options.max_split_size && block_size >= options.max_split_size) return false;
  // An oversize request may take a block only slightly larger than itself.
  return !(rounded >= options.max_split_size && block_size >= rounded + options.max_non_split_rounding_size);
}

// Whether a free block of `block_size` serving `rounded` bytes is split, the
// remainder going back to the pool (torch: should_split).
inline bool should_split(PoolKind pool, size_t block_size, size_t rounded, const Options& options) {
  size_t remaining = block_size - rounded;
  if (pool == PoolKind::kSmall) return remaining >= kMinBlockSize;
  return rounded < options.max_split_size && remaining > kSmallSize;
}

}  // namespace amem
