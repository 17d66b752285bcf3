// fake_cuda.cpp — the fake CUDA driver (libcuda.so.1) and the state both fakes
// share (see fake_cuda.h). Only what the cuda backend calls.
#include "fake_cuda.h"

#include <sys/mman.h>

#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace {

constexpr int kDevices = 2;
constexpr size_t kGranularity = size_t{2} << 20;
constexpr int kInvalidValue = 1, kOutOfMemory = 2, kInvalidDevice = 101, kNotFound = 500;
constexpr int kCaptureUnsupported = 900;  // cudaErrorStreamCaptureUnsupported / CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
constexpr int kGlobal = 0, kThreadLocal = 1, kRelaxed = 2;  // cudaStreamCaptureMode

struct Handle { size_t bytes; int device; int mappings; };
struct Mapping { size_t bytes; unsigned long long handle; unsigned readers; };  // readers: a bit per device (cuMemSetAccess)

struct State {
  std::mutex mutex;
  size_t capacity = 0;
  size_t used[kDevices] = {};
  bool vmm = true;
  bool peers = true;
  bool contexts[kDevices] = {};                       // primary contexts the runtime created                                  // the devices can reach each other (cuDeviceCanAccessPeer)
  std::map<std::string, std::pair<int, int>> failures;  // function -> {calls to let through, code}
  std::set<uint64_t> busy_streams;
  std::map<unsigned long long, Handle> handles;
  unsigned long long next_handle = 1;
  std::map<uintptr_t, size_t> ranges;                 // reserved: first address -> bytes
  std::map<uintptr_t, Mapping> mappings;              // mapped: first address -> mapping
  size_t allocations = 0, events = 0, violations = 0;
  std::set<std::pair<uint64_t, uint64_t>> waits;      // (consumer, producer) stream pairs
  int sticky = 0;
  int fatal = 0;                                      // a sticky error: every runtime call fails
  std::map<uint64_t, int> stream_devices;             // cudaStreamGetDevice
};

struct Capture { int mode; std::thread::id thread; bool invalidated; };

struct Captures {
  std::mutex mutex;
  std::map<uint64_t, Capture> by_stream;  // streams capturing now
  size_t refusals = 0, invalidated = 0;
};

Captures& captures() {
  static Captures c;
  return c;
}
thread_local int thread_capture_mode = kGlobal;  // cudaThreadExchangeStreamCaptureMode

State& state() {
  static State s;
  return s;
}

// A rule was broken: count it and answer `code`.
int violation(int code) {
  state().violations += 1;
  return code;
}

bool in_a_range(const State& s, uintptr_t address, size_t bytes) {
  auto it = s.ranges.upper_bound(address);
  if (it == s.ranges.begin()) return false;
  --it;
  return address >= it->first && address + bytes <= it->first + it->second;
}

bool overlaps_a_mapping(const State& s, uintptr_t address, size_t bytes) {
  auto it = s.mappings.lower_bound(address);
  if (it != s.mappings.end() && it->first < address + bytes) return true;
  if (it == s.mappings.begin()) return false;
  --it;
  return it->first + it->second.bytes > address;
}

}  // namespace

extern "C" {

// ---------------------------------------------------------------- control

void fake_cuda_reset(size_t capacity) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  for (auto& [address, bytes] : s.ranges) munmap(reinterpret_cast<void*>(address), bytes);
  s.capacity = capacity;
  std::memset(s.used, 0, sizeof(s.used));
  s.vmm = true;
  s.peers = true;
  std::memset(s.contexts, 0, sizeof(s.contexts));
  s.failures.clear();
  s.busy_streams.clear();
  s.handles.clear();
  s.ranges.clear();
  s.mappings.clear();
  s.allocations = s.events = s.violations = 0;
  s.waits.clear();
  s.sticky = 0;
  s.fatal = 0;
  s.stream_devices.clear();
  std::lock_guard<std::mutex> capture_lock(captures().mutex);
  captures().by_stream.clear();
  captures().refusals = captures().invalidated = 0;
  thread_capture_mode = kGlobal;
}

void fake_cuda_set_peer_access(bool peers) {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().peers = peers;
}

unsigned fake_cuda_page_readers(uintptr_t address) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.mappings.upper_bound(address);
  if (it == s.mappings.begin()) return 0;
  --it;
  return address < it->first + it->second.bytes ? it->second.readers : 0;
}

FakeCudaCounts fake_cuda_counts() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  FakeCudaCounts c;
  c.allocations = s.allocations;
  c.handles = s.handles.size();
  c.mappings = s.mappings.size();
  for (auto& [address, m] : s.mappings)
    c.mappings_without_access += (m.readers >> s.handles.at(m.handle).device) & 1u ? 0 : 1;
  c.ranges = s.ranges.size();
  c.events = s.events;
  c.stream_waits = s.waits.size();
  for (int d = 0; d < kDevices; ++d) c.used_bytes[d] = s.used[d];
  c.violations = s.violations;
  c.sticky_error = s.sticky;
  std::lock_guard<std::mutex> capture_lock(captures().mutex);
  c.capture_refusals = captures().refusals;
  c.invalidated_captures = captures().invalidated;
  return c;
}

void fake_cuda_fail_next(const char* function, int code) {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().failures[function] = {0, code};
}

void fake_cuda_fail_after(const char* function, int skip, int code) {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().failures[function] = {skip, code};
}

void fake_cuda_set_stream_busy(uint64_t stream, bool busy) {
  std::lock_guard<std::mutex> lock(state().mutex);
  if (busy) state().busy_streams.insert(stream);
  else state().busy_streams.erase(stream);
}

void fake_cuda_set_vmm_supported(bool supported) { state().vmm = supported; }

void fake_cuda_set_stream_device(uint64_t stream, int device) {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().stream_devices[stream] = device;
}

void fake_cuda_set_fatal_error(int code) { state().fatal = code; }

// ---------------------------------------------------------------- shared with the runtime

bool fake_cuda_take_failure(const char* function, int* code) {
  auto& failures = state().failures;
  auto it = failures.find(function);
  if (it == failures.end()) return false;
  if (it->second.first > 0) {
    it->second.first -= 1;
    return false;
  }
  *code = it->second.second;
  failures.erase(it);
  return true;
}

bool fake_cuda_charge(int device, size_t bytes) {
  State& s = state();
  if (s.used[device] + bytes > s.capacity) return false;
  s.used[device] += bytes;
  return true;
}

void fake_cuda_refund(int device, size_t bytes) { state().used[device] -= bytes; }
int fake_cuda_device_count() { return kDevices; }
void fake_cuda_note_context(int device) {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().contexts[device] = true;
}
bool fake_cuda_has_context(int device) {
  std::lock_guard<std::mutex> lock(state().mutex);
  return device >= 0 && device < kDevices && state().contexts[device];
}
size_t fake_cuda_capacity() { return state().capacity; }
void fake_cuda_finish_all_work() {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().busy_streams.clear();
}
void fake_cuda_note_violation() { state().violations += 1; }
bool fake_cuda_stream_busy(uint64_t stream) { return state().busy_streams.count(stream) != 0; }
size_t* fake_cuda_live_counter(const char* what) {
  return std::strcmp(what, "events") == 0 ? &state().events : &state().allocations;
}
int* fake_cuda_sticky_error() { return &state().sticky; }
void fake_cuda_note_wait(uint64_t consumer, uint64_t producer) { state().waits.insert({consumer, producer}); }
bool fake_cuda_waited(uint64_t consumer, uint64_t producer) {
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().waits.count({consumer, producer}) != 0;
}
int fake_cuda_fatal_error() { return state().fatal; }

int fake_cuda_stream_device(uint64_t stream) {
  std::lock_guard<std::mutex> lock(state().mutex);
  auto it = state().stream_devices.find(stream);
  return it == state().stream_devices.end() ? 0 : it->second;
}

// CUDA's rule for potentially unsafe calls during stream capture (fake_cuda.h).
int fake_cuda_capture_check(bool sync) {
  Captures& c = captures();
  std::lock_guard<std::mutex> lock(c.mutex);
  const auto self = std::this_thread::get_id();
  bool refused = false;
  for (auto& [stream, capture] : c.by_stream) {
    const bool own = capture.thread == self && capture.mode != kRelaxed;
    const bool conflicts = sync || (thread_capture_mode == kGlobal && (own || capture.mode == kGlobal)) ||
                           (thread_capture_mode == kThreadLocal && own);
    if (!conflicts) continue;
    refused = true;
    if (!capture.invalidated) c.invalidated += 1;
    capture.invalidated = true;
  }
  if (!refused) return 0;
  c.refusals += 1;
  return kCaptureUnsupported;
}

// ---------------------------------------------------------------- stream capture (runtime API)

int fake_cuda_begin_capture(uint64_t stream, int mode) {
  Captures& c = captures();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (mode < kGlobal || mode > kRelaxed || c.by_stream.count(stream)) return violation(kInvalidValue);
  c.by_stream[stream] = Capture{mode, std::this_thread::get_id(), false};
  return 0;
}

// 0, or cudaErrorStreamCaptureInvalidated (901) when a refused call broke the capture.
int fake_cuda_end_capture(uint64_t stream) {
  Captures& c = captures();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto it = c.by_stream.find(stream);
  if (it == c.by_stream.end()) return violation(kInvalidValue);
  const bool invalidated = it->second.invalidated;
  c.by_stream.erase(it);
  return invalidated ? 901 : 0;
}

bool fake_cuda_stream_capturing(uint64_t stream) {
  std::lock_guard<std::mutex> lock(captures().mutex);
  return captures().by_stream.count(stream) != 0;
}

int fake_cuda_exchange_capture_mode(int mode) {
  const int previous = thread_capture_mode;
  thread_capture_mode = mode;
  return previous;
}

// ---------------------------------------------------------------- the driver API

#define FAKE_FAILURE(name)                              \
  do {                                                  \
    int code_ = 0;                                      \
    if (fake_cuda_take_failure(name, &code_)) return code_; \
  } while (0)

#define CAPTURE_CHECK()                                            \
  do {                                                             \
    if (int code_ = fake_cuda_capture_check(false)) return code_; \
  } while (0)

struct FakeLocation { int type; int id; };
struct FakeProp { int type; int handle_types; FakeLocation location; void* win32; unsigned char flags[8]; };
struct FakeAccess { FakeLocation location; int flags; };

int cuDeviceGet(int* device, int ordinal) {
  FAKE_FAILURE("cuDeviceGet");
  if (ordinal < 0 || ordinal >= kDevices) return violation(kInvalidDevice);
  *device = ordinal;
  return 0;
}

int cuDeviceGetAttribute(int* value, int attribute, int device) {
  FAKE_FAILURE("cuDeviceGetAttribute");
  if (device < 0 || device >= kDevices) return violation(kInvalidDevice);
  *value = attribute == 102 ? static_cast<int>(state().vmm) : 0;
  return 0;
}

int cuDeviceGetCount(int* count) {
  FAKE_FAILURE("cuDeviceGetCount");
  *count = kDevices;
  return 0;
}

int cuDeviceCanAccessPeer(int* can, int device, int peer) {
  FAKE_FAILURE("cuDeviceCanAccessPeer");
  if (device < 0 || device >= kDevices || peer < 0 || peer >= kDevices || device == peer)
    return violation(kInvalidDevice);
  *can = static_cast<int>(state().peers);
  return 0;
}

int cuGetErrorString(int error, const char** text) {
  switch (error) {
    case 0: *text = "no error"; return 0;
    case kInvalidValue: *text = "invalid argument"; return 0;
    case kOutOfMemory: *text = "out of memory"; return 0;
    case kInvalidDevice: *text = "invalid device ordinal"; return 0;
    case kNotFound: *text = "named symbol not found"; return 0;
    case kCaptureUnsupported: *text = "operation not supported when stream is capturing"; return 0;
    default: *text = nullptr; return kInvalidValue;
  }
}

int cuMemGetAllocationGranularity(size_t* granularity, const FakeProp* prop, int option) {
  FAKE_FAILURE("cuMemGetAllocationGranularity");
  if (prop == nullptr || prop->type != 1 || prop->location.type != 1) return violation(kInvalidValue);
  *granularity = kGranularity;
  return 0;
}

int cuMemAddressReserve(unsigned long long* address, size_t bytes, size_t alignment, unsigned long long hint,
                        unsigned long long flags) {
  FAKE_FAILURE("cuMemAddressReserve");
  CAPTURE_CHECK();
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (bytes == 0 || bytes % kGranularity != 0) return violation(kInvalidValue);
  void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return kOutOfMemory;
  s.ranges[reinterpret_cast<uintptr_t>(p)] = bytes;
  *address = reinterpret_cast<uintptr_t>(p);
  return 0;
}

int cuMemAddressFree(unsigned long long address, size_t bytes) {
  FAKE_FAILURE("cuMemAddressFree");
  CAPTURE_CHECK();
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.ranges.find(address);
  if (it == s.ranges.end() || it->second != bytes || overlaps_a_mapping(s, address, bytes))
    return violation(kInvalidValue);
  munmap(reinterpret_cast<void*>(address), bytes);
  s.ranges.erase(it);
  return 0;
}

int cuMemCreate(unsigned long long* handle, size_t bytes, const FakeProp* prop, unsigned long long flags) {
  FAKE_FAILURE("cuMemCreate");
  CAPTURE_CHECK();
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (prop == nullptr || prop->type != 1 || prop->location.type != 1 || prop->location.id < 0 ||
      prop->location.id >= kDevices || bytes == 0 || bytes % kGranularity != 0)
    return violation(kInvalidValue);
  if (!fake_cuda_charge(prop->location.id, bytes)) return kOutOfMemory;
  *handle = s.next_handle++;
  s.handles[*handle] = Handle{bytes, prop->location.id, 0};
  return 0;
}

int cuMemRelease(unsigned long long handle) {
  FAKE_FAILURE("cuMemRelease");
  CAPTURE_CHECK();
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.handles.find(handle);
  if (it == s.handles.end() || it->second.mappings != 0) return violation(kInvalidValue);
  fake_cuda_refund(it->second.device, it->second.bytes);
  s.handles.erase(it);
  return 0;
}

int cuMemMap(unsigned long long address, size_t bytes, size_t offset, unsigned long long handle,
             unsigned long long flags) {
  FAKE_FAILURE("cuMemMap");
  CAPTURE_CHECK();
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto h = s.handles.find(handle);
  if (h == s.handles.end() || offset != 0 || bytes != h->second.bytes || !in_a_range(s, address, bytes) ||
      overlaps_a_mapping(s, address, bytes))
    return violation(kInvalidValue);
  h->second.mappings += 1;
  s.mappings[address] = Mapping{bytes, handle, 0u};
  return 0;
}

int cuMemUnmap(unsigned long long address, size_t bytes) {
  FAKE_FAILURE("cuMemUnmap");
  CAPTURE_CHECK();
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.mappings.find(address);
  if (it == s.mappings.end() || it->second.bytes != bytes) return violation(kInvalidValue);  // whole mappings only
  s.handles[it->second.handle].mappings -= 1;
  s.mappings.erase(it);
  return 0;
}

int cuMemSetAccess(unsigned long long address, size_t bytes, const FakeAccess* desc, size_t count) {
  FAKE_FAILURE("cuMemSetAccess");
  CAPTURE_CHECK();
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (desc == nullptr || count == 0) return violation(kInvalidValue);
  unsigned readers = 0;
  for (size_t i = 0; i < count; ++i) {
    const FakeAccess& d = desc[i];
    if (d.flags != 3 || d.location.type != 1 || d.location.id < 0 || d.location.id >= kDevices)
      return violation(kInvalidValue);
    readers |= 1u << d.location.id;
  }
  size_t covered = 0;  // every byte must be mapped
  for (auto it = s.mappings.find(address); it != s.mappings.end() && it->first == address + covered &&
                                           covered < bytes;
       ++it)
    covered += it->second.bytes;
  if (covered != bytes) return violation(kInvalidValue);
  for (auto it = s.mappings.find(address); it != s.mappings.end() && it->first < address + bytes; ++it) {
    const int owner = s.handles.at(it->second.handle).device;
    if (!s.peers && (readers & ~(1u << owner)) != 0) return violation(kInvalidDevice);  // a peer that cannot reach it
    it->second.readers |= readers;
  }
  return 0;
}

}  // extern "C"
