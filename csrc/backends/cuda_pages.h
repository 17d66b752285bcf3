// cuda_pages.h — expandable segments on a CUDA device: ranges of device
// addresses reserved with the driver's virtual memory API and backed by
// physical memory page by page.
//
// Design note
// -----------
// torch's ExpandableSegment does the same (c10/cuda/CUDACachingAllocator.cpp):
// cuMemAddressReserve for the range, then per page cuMemCreate (a physical
// allocation of one page) and cuMemMap, and cuMemSetAccess to make the new
// pages readable and writable from the device; unmapping is cuMemUnmap and
// cuMemRelease per page. The driver can only unmap whole mappings, so each
// page is its own mapping: the core maps and unmaps whole pages (backend.h),
// and every call here checks that it does.
//
// Note [peer access to pages]: memory from cudaMalloc is readable by a peer
// device once that peer's context enabled peer access (torch's P2P copies call
// cudaDeviceEnablePeerAccess), but mapped pages are readable only by the
// devices named in cuMemSetAccess. torch's native allocator adds a peer to its
// expandable segments when torch enables peer access (enablePeerAccess); a
// pluggable allocator is never told. So every page is mapped for its own device
// and for every device the driver says can reach it (cuDeviceCanAccessPeer,
// read once when the device opens), in the same one cuMemSetAccess call:
// P2P copies and kernels reading a peer's tensor work as with cudaMalloc.
//
// The driver's functions are resolved at run time from the libcuda the CUDA
// runtime loaded (cuda_driver_abi.h), so nothing links against CUDA. Callers
// hold the device current (the cuda backend's DeviceGuard). An out-of-memory
// while mapping undoes the pages that call mapped and answers false; any
// other driver error throws BackendError with the driver's message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda_driver_abi.h"
#include "../core/page_layout.h"

namespace amem {

struct CudaDriver;

class CudaPages {
 public:
  // Pages for `device`, or nullptr with the reason in `why` when the driver
  // or the device cannot map pages.
  static std::unique_ptr<CudaPages> open(int device, std::string* why);

  // 0 when the device has no address space left.
  uintptr_t reserve(size_t bytes, const PageLayout& layout);
  // Unmaps whatever is still mapped, then gives the addresses back.
  void release(uintptr_t address, size_t bytes);
  // False (with nothing mapped) when the device is out of memory.
  bool map(uintptr_t address, size_t bytes);
  void unmap(uintptr_t address, size_t bytes);

  size_t mapped_pages() const { return mapped_pages_; }

 private:
  struct Page {
    cudrv::Handle handle = 0;
    bool mapped = false;
  };
  struct Range {
    size_t bytes = 0;
    PageLayout layout;        // page boundaries (page_layout.h)
    std::vector<Page> pages;  // in address order
  };

  CudaPages(const CudaDriver& driver, int device, size_t granularity, std::vector<cudrv::AccessDesc> readers)
      : driver_(driver), device_(device), granularity_(granularity), readers_(std::move(readers)) {}
  // The range holding [address, address + bytes), which must be whole pages;
  // sets `offset` to `address`'s offset in it.
  Range& pages_of(uintptr_t address, size_t bytes, size_t* offset);
  cudrv::Result map_page(uintptr_t address, size_t page_bytes, Page& page);
  void unmap_page(uintptr_t address, size_t page_bytes, Page& page);

  const CudaDriver& driver_;
  int device_;
  size_t granularity_;                // the driver's minimum for one physical allocation
  std::vector<cudrv::AccessDesc> readers_;  // devices given access to every page (Note [peer access to pages])
  std::map<uintptr_t, Range> ranges_;  // by first address
  size_t mapped_pages_ = 0;
};

}  // namespace amem
