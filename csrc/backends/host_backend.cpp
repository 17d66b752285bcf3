// host_backend.cpp — segments in real host memory.
//
// Each segment is an anonymous private mapping (MAP_NORESERVE), so pages cost
// nothing until a test writes into them, and writing a pattern into every
// block and checking it on free detects any overlap the policy could cause.
#include <sys/mman.h>

#include "../core/errors.h"
#include "simulated_streams.h"

namespace amem {
namespace {

class HostBackend final : public SimulatedBackend {
 public:
  using SimulatedBackend::SimulatedBackend;

  const char* name() const override { return "host"; }

  uintptr_t allocate_segment(size_t bytes) override {
    if (!fits(bytes)) return 0;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return 0;  // the host is out of address space: an OOM like any other
    used_bytes_ += bytes;
    return reinterpret_cast<uintptr_t>(p);
  }

  // Expandable segments: reserve with PROT_NONE, map by making pages
  // accessible, unmap by dropping the pages and making them inaccessible again,
  // so a stray access to an unmapped page faults as it would on a device.
  bool supports_expandable() const override { return true; }

  uintptr_t reserve_address_range(size_t bytes, const PageLayout&) override {
    void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? 0 : reinterpret_cast<uintptr_t>(p);
  }

  void release_address_range(uintptr_t address, size_t bytes) override {
    if (munmap(reinterpret_cast<void*>(address), bytes) != 0)
      throw BackendError("amem host backend: munmap failed for a reserved range");
  }

  bool map_pages(uintptr_t address, size_t bytes) override {
    if (!fits(bytes)) return false;
    if (mprotect(reinterpret_cast<void*>(address), bytes, PROT_READ | PROT_WRITE) != 0) return false;
    used_bytes_ += bytes;
    return true;
  }

  void unmap_pages(uintptr_t address, size_t bytes) override {
    void* p = reinterpret_cast<void*>(address);
    if (madvise(p, bytes, MADV_DONTNEED) != 0 || mprotect(p, bytes, PROT_NONE) != 0)
      throw BackendError("amem host backend: could not unmap pages it mapped");
    used_bytes_ -= bytes;
  }

  void release_segment(uintptr_t address, size_t bytes) override {
    if (munmap(reinterpret_cast<void*>(address), bytes) != 0)
      throw BackendError("amem host backend: munmap failed for a segment it mapped");
    used_bytes_ -= bytes;
  }
};

}  // namespace

std::unique_ptr<Backend> make_host_backend(size_t limit_bytes) {
  return std::make_unique<HostBackend>(limit_bytes);
}

}  // namespace amem
