// sim_backend.cpp — addresses only; no memory is touched.
//
// Hands out 2 MiB-aligned addresses from a simulated device address space
// (first fit over a map of free ranges, merged on release), so a trace with an
// 80 GB peak replays on a small machine and addresses are reused the way a
// device's would be. Nothing may be written to these addresses.
#include <map>

#include "../core/constants.h"
#include "../core/errors.h"
#include "simulated_streams.h"

namespace amem {
namespace {

constexpr uintptr_t kSimBase = uintptr_t{0x7f0000000000};  // looks like a device address
constexpr size_t kSimSpace = size_t{1} << 46;              // bytes of simulated address space
constexpr size_t kSimAlign = 2 * kMiB;                     // segment alignment
constexpr uintptr_t kReserveBase = uintptr_t{1} << 47;     // reserved (expandable) ranges start here
constexpr uintptr_t kReserveEnd = uintptr_t{1} << 62;      // ...and end here

class SimBackend final : public SimulatedBackend {
 public:
  explicit SimBackend(size_t limit_bytes) : SimulatedBackend(limit_bytes) {
    free_ranges_[kSimBase] = kSimSpace;
  }

  const char* name() const override { return "sim"; }

  uintptr_t allocate_segment(size_t bytes) override {
    if (!fits(bytes)) return 0;
    size_t span = (bytes + kSimAlign - 1) / kSimAlign * kSimAlign;
    for (auto it = free_ranges_.begin(); it != free_ranges_.end(); ++it) {
      if (it->second < span) continue;
      uintptr_t address = it->first;
      size_t left = it->second - span;
      free_ranges_.erase(it);
      if (left > 0) free_ranges_[address + span] = left;
      used_bytes_ += bytes;
      return address;
    }
    return 0;  // simulated address space exhausted
  }

  // Expandable segments: reserved ranges come from a separate, much larger
  // region above the segment space; mapping only counts bytes against the limit.
  bool supports_expandable() const override { return true; }

  uintptr_t reserve_address_range(size_t bytes, const PageLayout&) override {
    size_t span = (bytes + kSimAlign - 1) / kSimAlign * kSimAlign;
    if (span > kReserveEnd - next_reserve_) return 0;
    uintptr_t address = next_reserve_;
    next_reserve_ += span;
    return address;
  }

  bool map_pages(uintptr_t, size_t bytes) override {
    if (!fits(bytes)) return false;
    used_bytes_ += bytes;
    return true;
  }

  void unmap_pages(uintptr_t, size_t bytes) override { used_bytes_ -= bytes; }

  void release_segment(uintptr_t address, size_t bytes) override {
    size_t span = (bytes + kSimAlign - 1) / kSimAlign * kSimAlign;
    auto next = free_ranges_.lower_bound(address);
    if (next != free_ranges_.end() && next->first == address)
      throw BackendError("amem sim backend: released a segment twice");
    auto [it, inserted] = free_ranges_.emplace(address, span);
    if (next != free_ranges_.end() && address + span == next->first) {
      it->second += next->second;
      free_ranges_.erase(next);
    }
    if (it != free_ranges_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == address) {
        prev->second += it->second;
        free_ranges_.erase(it);
      }
    }
    used_bytes_ -= bytes;
  }

 private:
  std::map<uintptr_t, size_t> free_ranges_;  // address -> bytes
  uintptr_t next_reserve_ = kReserveBase;    // bump pointer for reserved ranges (never reused)
};

}  // namespace

std::unique_ptr<Backend> make_sim_backend(size_t limit_bytes) {
  return std::make_unique<SimBackend>(limit_bytes);
}

}  // namespace amem
