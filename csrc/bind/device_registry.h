// device_registry.h — the process-wide CUDA allocators torch calls into.
//
// Design note
// -----------
// One CachingAllocator per CUDA device, created on the device's first
// allocation with the options configured by amem_alloc.enable() (or AMEM_CONF),
// so each device has its own pools, stats and lock. The hot path reads an
// atomic pointer; creation takes a mutex once per device. Allocators are never
// destroyed: at interpreter exit the CUDA runtime may already be gone, and the
// driver reclaims device memory with the process (torch does the same).
#pragma once

#include <string>
#include <vector>

#include "../core/caching_allocator.h"

namespace amem {

constexpr int kMaxDevices = 64;  // torch: C10_COMPILE_TIME_MAX_GPUS is at most this

// Sets the options for devices not yet created. Throws ConfigError on a bad
// string, and std::logic_error once any device has allocated (too late).
// expandable_optional: expandable segments come from a policy rather than the
// user's own setting, so a device that cannot map pages gets plain segments
// (and one line on stderr saying why) instead of a ConfigError.
void registry_configure(const std::string& conf, bool expandable_optional = false);
std::string registry_settings();
Options registry_options();
// The device's allocator, created on first use. Throws for a bad index.
CachingAllocator& registry_device(int device);
// The device's allocator if it exists, else nullptr.
CachingAllocator* registry_existing(int device);
std::vector<int> registry_devices_in_use();
// The device holding a live allocation at `address`, or -1.
int registry_owner(uintptr_t address);
// Tests only: serve "devices" from the host or sim backend instead of CUDA, so
// the C entry points can be driven on a machine without a GPU. Must come
// before the first allocation. ("cuda" restores the default.)
void registry_use_backend(const std::string& name, size_t limit_bytes);
// Recording on every device, present and future (max_entries 0 stops it).
void registry_record(size_t max_entries);

}  // namespace amem
