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
