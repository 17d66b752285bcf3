// introspect.cpp — what the allocator holds, as JSON: stats, segments with
// their blocks, fragmentation; and the messages for bad frees and OOM.
//
// JSON is the export format so that the Python side (and any other reader)
// never depends on struct layout. Block states use torch's snapshot names:
// active_allocated, active_pending_free, inactive.
#include <algorithm>
#include <cstdio>

#include "caching_allocator.h"

namespace amem {
namespace {

std::string hex(uintptr_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

const char* state_of(const Block* b) {
  if (b->allocated) return "active_allocated";
  if (b->pending_events > 0) return "active_pending_free";
  return "inactive";
}

std::string block_json(const Block* b) {
  return "{\"address\":" + std::to_string(b->address) + ",\"size\":" + std::to_string(b->size) +
         ",\"requested_size\":" + std::to_string(b->requested) + ",\"stream\":" +
         std::to_string(b->stream) + ",\"state\":\"" + state_of(b) +
         "\",\"alloc_seq\":" + std::to_string(b->alloc_seq) + "}";
}

std::string ratio(double num, double den) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6f", den > 0 ? num / den : 0.0);
  return buf;
}

// A size as a person reads it: "512 B", "3.00 GiB", "64.00 PiB" (never thousands of MiB).
std::string human_bytes(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  size_t unit = 0;
  while (bytes >= 1024.0 && unit + 1 < sizeof kUnits / sizeof kUnits[0]) {
    bytes /= 1024.0;
    ++unit;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, unit == 0 ? "%.0f %s" : "%.2f %s", bytes, kUnits[unit]);
  return buf;
}

std::string percent(double num, double den) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", den > 0 ? 100.0 * num / den : 0.0);
  return buf;
}

// One snapshot segment: the blocks from `first` up to (not including) `stop`.
std::string segment_entry(const Segment& seg, const Block* first, const Block* stop) {
  size_t total = 0, allocated = 0, active = 0, requested = 0;
  std::string blocks;
  for (const Block* b = first; b != stop; b = b->next) {
    total += b->size;
    if (b->allocated) allocated += b->size;
    if (b->allocated || b->pending_events > 0) active += b->size, requested += b->requested;
    blocks += (blocks.empty() ? "" : ",") + block_json(b);
  }
  return std::string("{\"address\":") + std::to_string(first->address) +
         ",\"total_size\":" + std::to_string(total) + ",\"stream\":" + std::to_string(seg.stream) +
         ",\"segment_type\":\"" + (seg.kind == PoolKind::kSmall ? "small" : "large") +
         "\",\"is_expandable\":" + (seg.expandable ? "true" : "false") +
         ",\"segment_pool_id\":[" + std::to_string(first->pool->owner.first) + "," +
         std::to_string(first->pool->owner.second) + "]" +
         ",\"allocated_size\":" + std::to_string(allocated) + ",\"active_size\":" + std::to_string(active) +
         ",\"requested_size\":" + std::to_string(requested) + ",\"blocks\":[" + blocks + "]}";
}

}  // namespace

std::string CachingAllocator::stats_json() const {
  Guard guard(*this);
  return stats_.to_json(options_.max_split_size);
}

// Every segment with its blocks; an expandable segment appears as one entry per
// contiguous mapped range, as in torch's snapshots.
std::string CachingAllocator::segments_json() const {
  Guard guard(*this);
  std::string out = "[";
  auto emit = [&](const std::string& entry) { out += (out.size() > 1 ? "," : "") + entry; };
  for (const auto& [address, seg] : segments_.all()) {
    if (!seg->expandable) {
      emit(segment_entry(*seg, seg->first, nullptr));
      continue;
    }
    for (const Block* b = seg->first; b != nullptr;) {
      if (!b->mapped) {
        b = b->next;
        continue;
      }
      const Block* stop = b;
      while (stop != nullptr && stop->mapped) stop = stop->next;
      emit(segment_entry(*seg, b, stop));
      b = stop;
    }
  }
  return out + "]";
}

CachingAllocator::FreeSpace CachingAllocator::free_space() const {
  FreeSpace space;
  for (const BlockPool* pool : pools_.all())
    for (const FreeEntry& e : pool->free_blocks) {
      space.total += e.size;
      space.largest = std::max(space.largest, e.size);
    }
  return space;
}

std::string CachingAllocator::fragmentation_json() const {
  Guard guard(*this);
  const double reserved = static_cast<double>(stats_.reserved_bytes.current());
  const double allocated = static_cast<double>(stats_.allocated_bytes.current());
  const double requested = static_cast<double>(stats_.requested_bytes.current());
  const double peak = static_cast<double>(stats_.reserved_bytes.peak());
  const double at_peak = static_cast<double>(stats_.allocated_at_reserved_peak);
  const FreeSpace space = free_space();
  const size_t total_free = space.total, largest = space.largest;
  auto num = [](double v) { return std::to_string(static_cast<int64_t>(v)); };
  return std::string("{") + "\"reserved_bytes\":" + num(reserved) +
         ",\"allocated_bytes\":" + num(allocated) + ",\"requested_bytes\":" + num(requested) +
         ",\"unused_reserved_bytes\":" + num(reserved - allocated) +
         ",\"fragmentation\":" + ratio(reserved - allocated, reserved) +
         ",\"peak_reserved_bytes\":" + num(peak) +
         ",\"allocated_bytes_at_reserved_peak\":" + num(at_peak) +
         ",\"fragmentation_at_reserved_peak\":" + ratio(peak - at_peak, peak) +
         ",\"free_bytes\":" + std::to_string(total_free) +
         ",\"largest_free_block\":" + std::to_string(largest) +
         ",\"external_fragmentation\":" +
         ratio(static_cast<double>(total_free - largest), static_cast<double>(total_free)) +
         ",\"internal_fragmentation_bytes\":" + num(allocated - requested) +
         ",\"internal_fragmentation\":" + ratio(allocated - requested, allocated) + "}";
}

void CachingAllocator::reset_peak_stats() {
  Guard guard(*this);
  stats_.reset_peaks();
}

void CachingAllocator::reset_accumulated_stats() {
  Guard guard(*this);
  stats_.reset_accumulated();
}

CachingAllocator::Figures CachingAllocator::figures() const {
  Guard guard(*this);
  return {stats_.allocated_bytes.current(), stats_.reserved_bytes.current()};
}

CachingAllocator::BlockInfo CachingAllocator::block_info(uintptr_t address) const {
  Guard guard(*this);
  Block* b = allocated_.find(address);       // a block's own start: O(1)
  if (b == nullptr) b = find_block_at(address);  // a pointer inside a block: walk its segment
  if (b == nullptr || !b->allocated) return {};
  return {b->address, b->size, b->requested, b->stream, b->alloc_seq};
}

// The block whose bytes include `address`, or nullptr.
Block* CachingAllocator::find_block_at(uintptr_t address) const {
  const Segment* seg = segments_.containing(address);
  if (seg == nullptr) return nullptr;
  for (Block* b = seg->first; b != nullptr; b = b->next)
    if (address >= b->address && address < b->address + b->size) return b;
  return nullptr;
}

std::string CachingAllocator::describe_bad_pointer(const char* operation, uintptr_t address) const {
  const Block* b = find_block_at(address);
  std::string what = std::string("amem: cannot ") + operation + " " + hex(address) + ": ";
  if (b == nullptr)
    return what + "this allocator (" + device_.name() +
           " backend) never returned that pointer; free it with the allocator that made it";
  if (b->address != address && !b->is_available())
    return what + "it points inside the block at " + hex(b->address) + " (" +
           std::to_string(b->size) + " bytes); free the pointer malloc returned";
  if (b->address != address)  // a freed block may have merged into its free neighbour
    return what + "it lies in cached free memory (the free block at " + hex(b->address) +
           "): it was already freed (double free) or never returned by malloc";
  const bool is_free_call = std::string(operation) == "free";
  if (b->pending_events > 0)
    return what + "it was already freed and waits for other streams" + (is_free_call ? " (double free)" : "");
  return what + "it was already freed" + (is_free_call ? " (double free)" : "");
}

[[noreturn]] void CachingAllocator::fail_out_of_memory(size_t size, size_t rounded, StreamId stream) {
  stats_.num_ooms += 1;
  DeviceMemoryInfo info = device_.memory_info();
  if (trace_.on()) trace_.record(TraceAction::k_oom, info.free_bytes, rounded, rounded, stream, 0);
  const auto reserved = stats_.reserved_bytes.current();
  const auto allocated = stats_.allocated_bytes.current();
  auto mib = [](double bytes) { return human_bytes(bytes); };
  std::string msg =
      "amem: out of memory on the " + std::string(device_.name()) + " backend: tried to allocate " +
      mib(static_cast<double>(size)) + " (" + std::to_string(rounded) + " bytes rounded) on stream " +
      hex(stream) + ". Reserved by amem: " + mib(static_cast<double>(reserved)) +
      "; allocated: " + mib(static_cast<double>(allocated)) + "; device free: " +
      mib(static_cast<double>(info.free_bytes)) + " of " + mib(static_cast<double>(info.total_bytes)) +
      "; largest cached free block: " + mib(static_cast<double>(free_space().largest)) +
      "; fragmentation (1 - allocated/reserved): " +
      percent(static_cast<double>(reserved - allocated), static_cast<double>(reserved)) + ".";
  if (device_.capped()) msg += " A memory fraction caps amem at " + mib(static_cast<double>(device_.allowed_bytes())) + ".";
  msg += " Try a smaller batch or sequence, free tensors you no longer need, or, if reserved is much"
         " larger than allocated, set max_split_size_mb or roundup_power2_divisions in AMEM_CONF.";
  throw OutOfMemoryError(msg);
}

}  // namespace amem
