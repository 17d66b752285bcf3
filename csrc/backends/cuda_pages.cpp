// cuda_pages.cpp — expandable segments on a CUDA device (see cuda_pages.h).
#include "cuda_pages.h"

#include <dlfcn.h>

#include <mutex>
#include <stdexcept>

#include "../core/errors.h"

namespace amem {

// ---------------------------------------------------------------- the driver's functions

struct CudaDriver {
  cudrv::DeviceGetFn device_get = nullptr;
  cudrv::DeviceGetAttributeFn device_get_attribute = nullptr;
  cudrv::DeviceGetCountFn device_get_count = nullptr;
  cudrv::DeviceCanAccessPeerFn can_access_peer = nullptr;
  cudrv::GetErrorStringFn error_string = nullptr;
  cudrv::MemGetAllocationGranularityFn granularity = nullptr;
  cudrv::MemAddressReserveFn address_reserve = nullptr;
  cudrv::MemAddressFreeFn address_free = nullptr;
  cudrv::MemCreateFn create = nullptr;
  cudrv::MemReleaseFn release = nullptr;
  cudrv::MemMapFn map = nullptr;
  cudrv::MemUnmapFn unmap = nullptr;
  cudrv::MemSetAccessFn set_access = nullptr;

  // The driver, or nullptr with the reason in `why`.
  static const CudaDriver* find(std::string* why);
  void check(cudrv::Result result, const char* what) const;
};

namespace {

template <typename Fn>
bool resolve(void* lib, Fn& fn, const char* symbol, std::string* missing) {
  fn = reinterpret_cast<Fn>(dlsym(lib, symbol));
  if (fn == nullptr && missing->empty()) *missing = symbol;
  return fn != nullptr;
}

}  // namespace

const CudaDriver* CudaDriver::find(std::string* why) {
  static CudaDriver driver;
  static std::string failure;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);  // the runtime's own copy
    if (lib == nullptr) lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      failure = "the CUDA driver (libcuda.so.1) could not be loaded";
      return;
    }
    std::string missing;
    CudaDriver& d = driver;
    resolve(lib, d.device_get, "cuDeviceGet", &missing);
    resolve(lib, d.device_get_attribute, "cuDeviceGetAttribute", &missing);
    resolve(lib, d.device_get_count, "cuDeviceGetCount", &missing);
    resolve(lib, d.can_access_peer, "cuDeviceCanAccessPeer", &missing);
    resolve(lib, d.error_string, "cuGetErrorString", &missing);
    resolve(lib, d.granularity, "cuMemGetAllocationGranularity", &missing);
    resolve(lib, d.address_reserve, "cuMemAddressReserve", &missing);
    resolve(lib, d.address_free, "cuMemAddressFree", &missing);
    resolve(lib, d.create, "cuMemCreate", &missing);
    resolve(lib, d.release, "cuMemRelease", &missing);
    resolve(lib, d.map, "cuMemMap", &missing);
    resolve(lib, d.unmap, "cuMemUnmap", &missing);
    resolve(lib, d.set_access, "cuMemSetAccess", &missing);
    if (!missing.empty()) failure = "the CUDA driver has no " + missing + " (a driver older than CUDA 10.2)";
  });
  if (!failure.empty()) {
    *why = failure;
    return nullptr;
  }
  return &driver;
}

void CudaDriver::check(cudrv::Result result, const char* what) const {
  if (result == cudrv::kSuccess) return;
  const char* text = nullptr;
  if (error_string(result, &text) != cudrv::kSuccess || text == nullptr) text = "unknown error";
  throw BackendError(std::string("amem cuda backend: ") + what + " failed: " + text + " (CUresult " +
                     std::to_string(result) + ")");
}

// ---------------------------------------------------------------- opening

namespace {

cudrv::AllocationProp device_memory(int device) {
  cudrv::AllocationProp prop;
  prop.type = cudrv::kAllocationTypePinned;
  prop.location.type = cudrv::kLocationTypeDevice;
  prop.location.id = device;
  return prop;
}

// Who may read and write `device`'s pages: the device itself, then every other
// device the driver says can reach it (Note [peer access to pages] in cuda_pages.h).
std::vector<cudrv::AccessDesc> readers_of(const CudaDriver& driver, int device) {
  std::vector<cudrv::AccessDesc> readers{{device_memory(device).location, cudrv::kAccessReadWrite}};
  int count = 0;
  driver.check(driver.device_get_count(&count), "cuDeviceGetCount");
  for (int peer = 0; peer < count; ++peer) {
    if (peer == device) continue;
    int can = 0;
    driver.check(driver.can_access_peer(&can, peer, device), "cuDeviceCanAccessPeer");
    if (can) readers.push_back({device_memory(peer).location, cudrv::kAccessReadWrite});
  }
  return readers;
}

}  // namespace

std::unique_ptr<CudaPages> CudaPages::open(int device, std::string* why) {
  const CudaDriver* driver = CudaDriver::find(why);
  if (driver == nullptr) return nullptr;
  cudrv::Device handle = 0;
  driver->check(driver->device_get(&handle, device), "cuDeviceGet");
  int supported = 0;
  driver->check(driver->device_get_attribute(&supported, cudrv::kAttributeVirtualMemory, handle),
                "cuDeviceGetAttribute");
  if (!supported) {
    *why = "CUDA device " + std::to_string(device) + " does not support virtual memory management";
    return nullptr;
  }
  const cudrv::AllocationProp prop = device_memory(device);
  size_t granularity = 0;
  driver->check(driver->granularity(&granularity, &prop, cudrv::kGranularityMinimum),
                "cuMemGetAllocationGranularity");
  return std::unique_ptr<CudaPages>(
      new CudaPages(*driver, device, granularity == 0 ? 1 : granularity, readers_of(*driver, device)));
}

// ---------------------------------------------------------------- ranges

uintptr_t CudaPages::reserve(size_t bytes, const PageLayout& layout) {
  const bool fine_ok = layout.fine_bytes == 0 ||
                       (layout.fine_page != 0 && layout.fine_page % granularity_ == 0 && layout.fine_bytes % layout.fine_page == 0);
  if (layout.page == 0 || layout.page % granularity_ != 0 || !fine_ok || bytes < layout.fine_bytes || !layout.is_boundary(bytes))
    throw BackendError("amem cuda backend: cannot reserve " + std::to_string(bytes) + " bytes in pages of " +
                       std::to_string(layout.page) + " (the first " + std::to_string(layout.fine_bytes) + " in pages of " +
                       std::to_string(layout.fine_page) + "): a page must be a multiple of the device's granularity (" +
                       std::to_string(granularity_) + " bytes) and the range end on a page boundary");
  cudrv::DevicePtr address = 0;
  const cudrv::Result result = driver_.address_reserve(&address, bytes, 0, 0, 0);
  if (result == cudrv::kErrorOutOfMemory) return 0;
  driver_.check(result, "cuMemAddressReserve");
  Range& range = ranges_[static_cast<uintptr_t>(address)];
  range.bytes = bytes;
  range.layout = layout;
  range.pages.assign(layout.index_of(bytes), Page{});
  return static_cast<uintptr_t>(address);
}

void CudaPages::release(uintptr_t address, size_t bytes) {
  auto it = ranges_.find(address);
  if (it == ranges_.end() || it->second.bytes != bytes)
    throw BackendError("amem cuda backend: release of a range it did not reserve");
  Range& range = it->second;
  for (size_t offset = 0, i = 0; offset < range.bytes; offset += range.layout.page_at(offset), ++i)
    if (range.pages[i].mapped) unmap_page(address + offset, range.layout.page_at(offset), range.pages[i]);
  ranges_.erase(it);
  driver_.check(driver_.address_free(address, bytes), "cuMemAddressFree");
}

CudaPages::Range& CudaPages::pages_of(uintptr_t address, size_t bytes, size_t* offset) {
  auto it = ranges_.upper_bound(address);
  if (it == ranges_.begin()) throw BackendError("amem cuda backend: an address outside every reserved range");
  --it;
  Range& range = it->second;
  *offset = address - it->first;
  if (*offset >= range.bytes || bytes > range.bytes - *offset || bytes == 0 || !range.layout.is_boundary(*offset) ||
      !range.layout.is_boundary(*offset + bytes))
    throw BackendError("amem cuda backend: a map or unmap of part of a page, or past its range");
  return range;
}

// ---------------------------------------------------------------- pages

bool CudaPages::map(uintptr_t address, size_t bytes) {
  size_t start = 0;
  Range& range = pages_of(address, bytes, &start);
  const size_t first = range.layout.index_of(start);
  cudrv::Result failure = cudrv::kSuccess;
  size_t done = 0;  // bytes this call has mapped
  for (size_t i = first; done < bytes; ++i) {
    Page& page = range.pages[i];
    if (page.mapped) throw BackendError("amem cuda backend: a page mapped twice");
    const size_t page_bytes = range.layout.page_at(start + done);
    failure = map_page(address + done, page_bytes, page);
    if (failure != cudrv::kSuccess) break;  // that page holds nothing
    done += page_bytes;
  }
  if (failure == cudrv::kSuccess) {
    failure = driver_.set_access(address, bytes, readers_.data(), readers_.size());
    if (failure == cudrv::kSuccess) return true;
  }
  for (size_t undone = 0, i = first; undone < done; ++i) {  // undo this call's pages
    const size_t page_bytes = range.layout.page_at(start + undone);
    unmap_page(address + undone, page_bytes, range.pages[i]);
    undone += page_bytes;
  }
  if (failure == cudrv::kErrorOutOfMemory) return false;
  driver_.check(failure, "mapping device pages (cuMemCreate, cuMemMap, cuMemSetAccess)");
  return false;
}

void CudaPages::unmap(uintptr_t address, size_t bytes) {
  size_t start = 0;
  Range& range = pages_of(address, bytes, &start);
  for (size_t done = 0, i = range.layout.index_of(start); done < bytes; ++i) {
    Page& page = range.pages[i];
    if (!page.mapped) throw BackendError("amem cuda backend: unmap of a page that is not mapped");
    const size_t page_bytes = range.layout.page_at(start + done);
    unmap_page(address + done, page_bytes, page);
    done += page_bytes;
  }
}

// One physical allocation of a page, mapped at `address`; on failure nothing is left behind.
cudrv::Result CudaPages::map_page(uintptr_t address, size_t page_bytes, Page& page) {
  const cudrv::AllocationProp prop = device_memory(device_);
  cudrv::Handle handle = 0;
  cudrv::Result result = driver_.create(&handle, page_bytes, &prop, 0);
  if (result != cudrv::kSuccess) return result;
  result = driver_.map(address, page_bytes, 0, handle, 0);
  if (result != cudrv::kSuccess) {
    driver_.release(handle);
    return result;
  }
  page = Page{handle, true};
  mapped_pages_ += 1;
  return cudrv::kSuccess;
}

void CudaPages::unmap_page(uintptr_t address, size_t page_bytes, Page& page) {
  driver_.check(driver_.unmap(address, page_bytes), "cuMemUnmap");
  driver_.check(driver_.release(page.handle), "cuMemRelease");
  page = Page{};
  mapped_pages_ -= 1;
}

}  // namespace amem
