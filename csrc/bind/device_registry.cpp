// device_registry.cpp — see device_registry.h.
#include "device_registry.h"

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "torch_devices.h"

namespace amem {
namespace {

std::array<std::atomic<CachingAllocator*>, kMaxDevices> g_devices{};
std::mutex g_mutex;                 // guards creation and the options below
bool g_configured = false;
Options g_options;
bool g_expandable_optional = false;  // see registry_configure
size_t g_trace_entries = 0;        // 0 = not recording
std::string g_backend = "cuda";    // tests may choose host or sim
size_t g_backend_limit = 0;

void check_index(int device) {
  if (device < 0 || device >= kMaxDevices)
    throw std::invalid_argument("amem: CUDA device index " + std::to_string(device) +
                                " is out of range [0, " + std::to_string(kMaxDevices) + ")");
}

// AMEM_CONF applies when nobody configured the registry explicitly (a program that
// loads the library as torch's pluggable allocator itself): over the core's defaults,
// torch's policy. amem_alloc.enable() always configures it, with its policy.
const Options& options_locked() {
  if (!g_configured) {
    const char* env = std::getenv("AMEM_CONF");
    g_options = Options::parse(env ? env : "");
    g_configured = true;
  }
  return g_options;
}

std::unique_ptr<Backend> make_backend_locked(int device) {
  if (g_backend == "host") return make_host_backend(g_backend_limit);
  if (g_backend == "sim") return make_sim_backend(g_backend_limit);
  return make_cuda_backend(device, torch_device_switch());  // Note [switching devices]
}

// The options for a new device on `backend`: a policy's expandable segments
// give way to plain segments where the device cannot map pages.
Options options_for_locked(int device, const Backend& backend) {
  Options options = options_locked();
  if (options.expandable_segments && g_expandable_optional && !backend.supports_expandable()) {
    options.expandable_segments = false;
    std::fprintf(stderr, "amem: CUDA device %d uses plain segments: %s\n", device,
                 backend.why_not_expandable().c_str());
  }
  return options;
}

}  // namespace

void registry_use_backend(const std::string& name, size_t limit_bytes) {
  if (name != "cuda" && name != "host" && name != "sim")
    throw std::invalid_argument("amem: registry backend must be cuda, host or sim, not '" + name + "'");
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!registry_devices_in_use().empty())
    throw std::logic_error("amem: the registry backend can only change before the first allocation");
  g_backend = name;
  g_backend_limit = limit_bytes;
}

int registry_owner(uintptr_t address) {
  for (int d : registry_devices_in_use())
    if (g_devices[d].load(std::memory_order_acquire)->block_info(address).size != 0) return d;
  return -1;
}

void registry_configure(const std::string& conf, bool expandable_optional) {
  Options parsed = Options::parse(conf);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!registry_devices_in_use().empty())
    throw std::logic_error(
        "amem: the CUDA allocator has already served allocations; its options are fixed. "
        "Set AMEM_CONF or call amem_alloc.enable(...) before the first CUDA tensor.");
  g_options = parsed;
  g_expandable_optional = expandable_optional;
  g_configured = true;
}

std::string registry_settings() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return options_locked().to_string();
}

Options registry_options() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return options_locked();
}

CachingAllocator& registry_device(int device) {
  check_index(device);
  if (CachingAllocator* a = g_devices[device].load(std::memory_order_acquire)) return *a;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (CachingAllocator* a = g_devices[device].load(std::memory_order_acquire)) return *a;
  std::unique_ptr<Backend> backend = make_backend_locked(device);
  Options options = options_for_locked(device, *backend);
  auto* created = new CachingAllocator(std::move(backend), options);
  if (g_trace_entries > 0) created->start_trace(g_trace_entries);
  g_devices[device].store(created, std::memory_order_release);
  return *created;
}

CachingAllocator* registry_existing(int device) {
  check_index(device);
  return g_devices[device].load(std::memory_order_acquire);
}

void registry_record(size_t max_entries) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_trace_entries = max_entries;
  for (int d = 0; d < kMaxDevices; ++d) {
    CachingAllocator* a = g_devices[d].load(std::memory_order_acquire);
    if (a == nullptr) continue;
    if (max_entries > 0) a->start_trace(max_entries);
    else a->stop_trace();
  }
}

std::vector<int> registry_devices_in_use() {
  std::vector<int> in_use;
  for (int d = 0; d < kMaxDevices; ++d)
    if (g_devices[d].load(std::memory_order_acquire) != nullptr) in_use.push_back(d);
  return in_use;
}

}  // namespace amem
