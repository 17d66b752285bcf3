// address_map.h — live allocations by address: an open-addressing hash table.
//
// Design note
// -----------
// free(address) must find its block in O(1) without allocating: the
// std::unordered_map this replaces allocated and freed a node on every
// malloc/free pair, about a third of the hot path's instructions. Keys are
// block addresses (never 0, and multiples of 512), so the slot is a
// multiplicative hash of address >> 9; collisions probe linearly, and erase
// shifts the following entries back (no tombstones, so lookups never slow
// down with churn). The table doubles when half full and never shrinks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace amem {

struct Block;

class AddressMap {
 public:
  AddressMap() : slots_(kInitialSlots) {}

  Block* find(uintptr_t address) const {
    for (size_t i = slot(address);; i = next(i)) {
      const Slot& s = slots_[i];
      if (s.address == address) return s.block;
      if (s.address == 0) return nullptr;
    }
  }

  // `address` must not be present.
  void insert(uintptr_t address, Block* block) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    place(address, block);
    size_ += 1;
  }

  // Returns false when `address` is not present.
  bool erase(uintptr_t address) {
    size_t i = slot(address);
    while (slots_[i].address != address) {
      if (slots_[i].address == 0) return false;
      i = next(i);
    }
    shift_back_from(i);
    size_ -= 1;
    return true;
  }

  size_t size() const { return size_; }

 private:
  struct Slot {
    uintptr_t address = 0;  // 0 = empty
    Block* block = nullptr;
  };
  static constexpr size_t kInitialSlots = 1024;  // a power of two

  size_t slot(uintptr_t address) const {
    return static_cast<size_t>(((address >> 9) * 0x9E3779B97F4A7C15ull) >> 32) & (slots_.size() - 1);
  }
  size_t next(size_t i) const { return (i + 1) & (slots_.size() - 1); }

  void place(uintptr_t address, Block* block) {
    size_t i = slot(address);
    while (slots_[i].address != 0) i = next(i);
    slots_[i] = {address, block};
  }

  // Backward-shift deletion: move later entries of the probe run into the hole.
  void shift_back_from(size_t hole) {
    for (size_t i = next(hole); slots_[i].address != 0; i = next(i)) {
      size_t home = slot(slots_[i].address);
      bool movable = hole <= i ? (home <= hole || home > i) : (home <= hole && home > i);
      if (movable) {
        slots_[hole] = slots_[i];
        hole = i;
      }
    }
    slots_[hole] = Slot{};
  }

  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    for (const Slot& s : old)
      if (s.address != 0) place(s.address, s.block);
  }

  std::vector<Slot> slots_;
  size_t size_ = 0;
};

}  // namespace amem
