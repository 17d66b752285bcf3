// constants.h — the size classes of PyTorch's native CUDA caching allocator.
//
// Design note
// -----------
// amem keeps PyTorch's size classes by default so that a workload behaves the
// same under amem as under the native allocator, and so that the `torch` replay
// policy can reproduce the native allocator's decisions. Every constant below is
// cited from PyTorch (c10/core/AllocatorConfig.h in recent releases; older ones
// keep them at the top of c10/cuda/CUDACachingAllocator.cpp). Units are in the
// names or the trailing comments. Nothing else in the core spells a size literal.
#pragma once

#include <cstddef>
#include <cstdint>

namespace amem {

constexpr size_t kKiB = 1024;
constexpr size_t kMiB = 1024 * kKiB;
constexpr size_t kGiB = 1024 * kMiB;

// Every request is rounded up to a multiple of this (torch: kMinBlockSize).
constexpr size_t kMinBlockSize = 512;  // bytes
// Requests up to this size go to the small pool (torch: kSmallSize).
constexpr size_t kSmallSize = 1 * kMiB;  // bytes
// Small-pool segments are this large (torch: kSmallBuffer).
constexpr size_t kSmallBuffer = 2 * kMiB;  // bytes
// Requests between kSmallSize and this get a kLargeBuffer segment (torch: kMinLargeAlloc).
constexpr size_t kMinLargeAlloc = 10 * kMiB;  // bytes
// Large-pool segments for mid-sized requests (torch: kLargeBuffer).
constexpr size_t kLargeBuffer = 20 * kMiB;  // bytes
// Requests of kMinLargeAlloc and more get a segment rounded up to this (torch: kRoundLarge).
constexpr size_t kRoundLarge = 2 * kMiB;  // bytes

// roundup_power2_divisions applies per power-of-two interval from 1 MiB to 64 GiB
// (torch: kRoundUpPowerOfTwoStart/End/Intervals in c10/core/AllocatorConfig.cpp).
constexpr size_t kRoundUpPowerOfTwoStart = 1 * kMiB;        // bytes
constexpr size_t kRoundUpPowerOfTwoEnd = 64 * kGiB;         // bytes
constexpr size_t kRoundUpPowerOfTwoIntervals = 16;          // intervals
// amem: the most roundup_power2_divisions the parser accepts (round_size computes
// kMinBlockSize * divisions, which must not overflow).
constexpr size_t kMaxRoundupDivisions = size_t{1} << 32;

// amem: the most requests map_ahead may map room for (the fine part bounds the bytes too).
constexpr size_t kMaxMapAhead = 16;  // requests

// The largest request the core accepts; beyond it rounding could overflow.
constexpr size_t kMaxRequest = size_t{1} << 56;  // bytes (64 PiB)

}  // namespace amem
