// page_layout.h — where the pages of an expandable segment begin and end.
//
// Design note
// -----------
// An expandable segment is mapped and unmapped in whole pages. torch's pages
// are all one size (2 MiB small pool, 20 MiB large pool); amem's fine_pages_mb
// makes the page grow with the segment (Note [fine pages], expandable.cpp):
// the first `fine_bytes` are pages of `fine_page`, the rest pages of `page`.
// The layout depends on the offset alone, so the core (which rounds its maps
// and unmaps to pages) and the cuda backend (which makes one physical
// allocation per page, because the driver unmaps only whole mappings) agree on
// every boundary without telling each other more than this.
#pragma once

#include <cstddef>

namespace amem {

struct PageLayout {
  size_t page = 0;        // bytes per page after the fine part
  size_t fine_bytes = 0;  // bytes at the front in fine pages (0: none); a multiple of fine_page
  size_t fine_page = 0;   // bytes per page in the fine part

  // The page boundary at or after / at or before `offset` bytes into the range.
  size_t ceil(size_t offset) const {
    if (offset < fine_bytes) return round_up(offset, fine_page);
    return fine_bytes + round_up(offset - fine_bytes, page);
  }
  size_t floor(size_t offset) const {
    if (offset < fine_bytes) return offset / fine_page * fine_page;
    return fine_bytes + (offset - fine_bytes) / page * page;
  }
  // The size of the page that starts at the boundary `offset`.
  size_t page_at(size_t offset) const { return offset < fine_bytes ? fine_page : page; }
  // Pages in the first `offset` bytes (`offset` a boundary): the index of the page starting there.
  size_t index_of(size_t offset) const {
    if (offset < fine_bytes) return offset / fine_page;
    return (fine_bytes == 0 ? 0 : fine_bytes / fine_page) + (offset - fine_bytes) / page;
  }
  bool is_boundary(size_t offset) const { return floor(offset) == offset; }

 private:
  static size_t round_up(size_t v, size_t step) { return (v + step - 1) / step * step; }
};

}  // namespace amem
