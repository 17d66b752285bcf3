// block.h — blocks, segments and the free-block index.
//
// Design note
// -----------
// A Segment is one piece of memory obtained from the backend. It is tiled,
// without gaps, by Blocks linked in address order (prev/next). A Block is
// either allocated (handed to a caller), free and cached in its pool's index,
// or "pending": freed by the caller but still in use by other streams until
// their events complete (Note [record_stream]).
//
// The free index (BlockPool) is an ordered set keyed by (stream, size,
// address), as in the native allocator, so the best fit for a request on a
// stream is one lower_bound: O(log n). Each entry carries a copy of its
// block's key, so a search touches only tree nodes, not the blocks (one cache
// miss per level instead of two).
// Set nodes are recycled through extract()/insert(node), so the steady state
// of malloc/free allocates nothing.
//
// Note [index hand-over]: splitting a cached block puts the remainder where
// the block was, and freeing a block next to a free one puts the merged block
// where the neighbour was. Most of the time the new key sorts between the
// same neighbours as the old one, so replace() rewrites the entry in place:
// no rebalancing, no search. Only when the order would change is the node
// moved. This turns the hot malloc+free pair's two erases and two inserts
// into two in-place writes.
//
// Note [index fingers]: a block taken out of the index remembers the block
// that followed it (`index_hint`); put back with the same key, it goes right
// before that block if that one is still indexed (std::set's hinted insert:
// no search, though the std::prev it checks costs one descent when the hint
// sits high in the tree). RMM's pool slows 15x from 4k to 64k free holes
// (rmm PR #2507); ours: benchmarks/RESULTS.md, "Free holes".
//
// Note [exact-size table]: each pool keeps a small direct-mapped table of
// exact keys (stream, size) that were recently asked for. A slot that holds a
// key knows that key's best fit: the indexed block of exactly that key with
// the lowest address, or none. Every change to the index keeps the owned slots
// true (note_added, note_removed: a removed lowest block is succeeded by the
// next entry, if it has the same key), so a request whose size owns a slot is
// answered without a search and without a neighbour step. A slot changes
// owner only after a search for its new key, which finds that key's lowest
// block too. A key that owns no slot costs a hash and a compare.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <set>
#include <utility>
#include <vector>

#include "backend.h"
#include "size_policy.h"
#include "stream_fences.h"

namespace amem {

struct Segment;
struct BlockPool;

// A private pool's identity: torch's MempoolId_t (a CUDA graph's or a MemPool's id).
using PoolId = std::pair<uint64_t, uint64_t>;
constexpr PoolId kDefaultPool{0, 0};

struct Block;

// One entry of the free index: a block and a copy of its key, equal to the
// block's own fields while it is indexed (validate.cpp checks this).
struct FreeEntry {
  StreamId stream = 0;
  size_t size = 0;
  uintptr_t address = 0;
  Block* block = nullptr;
};

// Orders free blocks by (stream, size, address): lower_bound of (stream,
// request, 0) is the best fit on that stream (torch: BlockComparatorSize).
struct FreeEntryLess {
  bool operator()(const FreeEntry& a, const FreeEntry& b) const {
    if (a.stream != b.stream) return a.stream < b.stream;
    if (a.size != b.size) return a.size < b.size;
    return a.address < b.address;
  }
};
using FreeIndex = std::set<FreeEntry, FreeEntryLess>;

struct Block {
  uintptr_t address = 0;       // first byte (device address, or simulated)
  size_t size = 0;             // bytes; a multiple of kMinBlockSize
  size_t requested = 0;        // bytes the caller asked for; 0 unless allocated
  StreamId stream = 0;         // the stream its segment serves
  Segment* segment = nullptr;  // the segment this block tiles
  BlockPool* pool = nullptr;   // the pool its segment belongs to
  Block* prev = nullptr;       // neighbour at lower addresses, same segment
  Block* next = nullptr;       // neighbour at higher addresses, same segment
  bool allocated = false;      // handed to a caller and not yet freed
  bool mapped = true;          // backed by memory (false: reserved pages of an expandable segment)
  int pending_events = 0;      // stream events to complete before reuse
  std::vector<StreamId> stream_uses;  // other streams that used it (record_stream)
  uint64_t free_since = 0;     // pool's get_free_block call count when freed (GC age)
  uint64_t idle_since = 0;     // allocator call count when last freed (page_reclaim_age)
  StreamId used_on = 0;        // the stream of its last request (cross_stream_reuse)
  std::vector<Fence> fences;   // frees to wait for before another stream reuses it (Note [cross-stream reuse])
  uint64_t alloc_seq = 0;      // allocation sequence number (provenance, traces)
  bool indexed = false;        // in its pool's free index, at `position`
  bool exact_lowest = false;   // an exact-size slot names it (Note [exact-size table])
  Block* index_hint = nullptr; // what followed it in the index when taken out (Note [index fingers])
  FreeIndex::const_iterator position;  // its entry, to erase or replace without a search

  bool is_split() const { return prev != nullptr || next != nullptr; }
  // Free and mapped: in the pool's free index, reusable as it is.
  bool is_free() const { return !allocated && pending_events == 0 && mapped; }
  // Could serve a request, after mapping if it is not mapped (torch: "allocatable").
  bool is_available() const { return !allocated && pending_events == 0; }
};

struct Segment {
  uintptr_t address = 0;       // as returned by the backend
  size_t size = 0;             // bytes
  StreamId stream = 0;         // the stream it was allocated for
  PoolKind kind = PoolKind::kSmall;
  Block* first = nullptr;      // block at `address`
  bool expandable = false;     // a reserved range mapped page by page (Note [expandable segments])
  size_t last_growth = 0;      // expandable: the rounded request that last grew the mapped end (Note [map ahead])
};

// Orders unmapped blocks by (stream, address): the first with room on a stream
// is the lowest address (torch: BlockComparatorAddress).
struct BlockAddressLess {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    return a->address < b->address;
  }
};

struct BlockPool {
  using Index = FreeIndex;

  explicit BlockPool(PoolKind k, PoolId owner_id = kDefaultPool) : kind(k), owner(owner_id) {}

  PoolKind kind;
  PoolId owner;                        // kDefaultPool, or the private pool this belongs to
  Index free_blocks;
  std::set<Block*, BlockAddressLess> unmapped;  // expandable segments' unmapped blocks
  uint64_t get_free_block_calls = 0;  // clock for the GC's block ages

  void insert(Block* block);
  void erase(Block* block);       // no-op unless indexed
  void take(Index::iterator it);  // erase by position
  // `by` takes the entry of the indexed block `old` (Note [index hand-over]).
  void replace(Block* old, Block* by);
  // The indexed `block`'s size or address changed: restore its entry.
  void rekey(Block* block);
  // The smallest free block on `stream` of at least `size` bytes, or end().
  Index::iterator best_fit(StreamId stream, size_t size);
  // The first block ordered at or after (stream, size), whatever its stream.
  Index::iterator lower_bound(StreamId stream, size_t size);
  // Whether every owned slot of the exact-size table is true (the walker's check).
  bool exact_table_is_true() const;

 private:
  // One slot of the exact-size table (Note [exact-size table]). size 0: unowned.
  struct ExactSlot {
    StreamId stream = 0;
    size_t size = 0;
    Block* lowest = nullptr;  // the key's indexed block with the lowest address, or none
    bool owns(StreamId s, size_t n) const { return size == n && stream == s; }
  };
  static constexpr int kExactSlotBits = 6;
  static constexpr size_t kExactSlots = size_t{1} << kExactSlotBits;

  void place(Index::iterator at, Block* block);
  Index::iterator move_entry(Index::iterator at, const FreeEntry& entry);
  ExactSlot& exact_slot(StreamId stream, size_t size) {
    return const_cast<ExactSlot&>(std::as_const(*this).exact_slot(stream, size));
  }
  const ExactSlot& exact_slot(StreamId stream, size_t size) const {
    // Fibonacci hashing: sizes in arithmetic progression spread over the slots.
    const uint64_t key = (size >> 9) ^ (stream >> 4) ^ stream;
    return exact_[(key * 0x9E3779B97F4A7C15ull) >> (64 - kExactSlotBits)];
  }
  void note_added(const FreeEntry& entry);
  // The entry at `at` is about to go or change its key.
  void note_removed(Index::iterator at);
  static void set_lowest(ExactSlot& slot, Block* block);

  std::vector<Index::node_type> spare_nodes_;  // recycled set nodes
  std::array<ExactSlot, kExactSlots> exact_{};
};

inline FreeEntry entry_of(const Block* b) { return {b->stream, b->size, b->address, const_cast<Block*>(b)}; }

// ---------------------------------------------------------------- inline: every malloc and free use these

inline void BlockPool::erase(Block* block) {
  if (block->indexed) take(block->position);
}

inline void BlockPool::take(Index::iterator it) {
  Block* block = it->block;
  block->indexed = false;
  const auto next = std::next(it);
  block->index_hint = next == free_blocks.end() ? nullptr : next->block;
  note_removed(it);
  spare_nodes_.push_back(free_blocks.extract(it));
}

inline void BlockPool::replace(Block* old, Block* by) {
  Index::iterator at = old->position;
  old->indexed = false;
  by->free_since = get_free_block_calls;
  place(at, by);
}

inline void BlockPool::rekey(Block* block) { place(block->position, block); }

// Points the entry at `at` to `block`, with its current key. In place when
// the key still sorts between the entry's neighbours; otherwise the node is
// moved to where the key sorts (Note [index hand-over]). A key that went down
// can only have passed the predecessor, one that went up only the successor,
// so one neighbour is looked at.
inline void BlockPool::place(Index::iterator at, Block* block) {
  const FreeEntry entry = entry_of(block);
  const FreeEntryLess less;
  note_removed(at);
  bool in_order;
  if (less(entry, *at)) {
    in_order = at == free_blocks.begin() || less(*std::prev(at), entry);
  } else {
    const auto next = std::next(at);
    in_order = next == free_blocks.end() || less(entry, *next);
  }
  // The set's elements are const only to protect the order, which this write
  // keeps; the node's storage itself is not a const object.
  if (in_order) const_cast<FreeEntry&>(*at) = entry;
  else at = move_entry(at, entry);
  block->indexed = true;
  block->position = at;
  note_added(entry);
}

inline void BlockPool::note_added(const FreeEntry& entry) {
  ExactSlot& slot = exact_slot(entry.stream, entry.size);
  if (slot.owns(entry.stream, entry.size) && (slot.lowest == nullptr || entry.address < slot.lowest->address))
    set_lowest(slot, entry.block);
}

inline void BlockPool::note_removed(Index::iterator at) {
  if (!at->block->exact_lowest) return;  // only a slot's lowest block matters
  const auto next = std::next(at);
  const bool twin = next != free_blocks.end() && next->size == at->size && next->stream == at->stream;
  set_lowest(exact_slot(at->stream, at->size), twin ? next->block : nullptr);
}

inline void BlockPool::set_lowest(ExactSlot& slot, Block* block) {
  if (slot.lowest != nullptr) slot.lowest->exact_lowest = false;
  slot.lowest = block;
  if (block != nullptr) block->exact_lowest = true;
}

inline BlockPool::Index::iterator BlockPool::lower_bound(StreamId stream, size_t size) {
  return free_blocks.lower_bound(FreeEntry{stream, size, 0, nullptr});
}

inline BlockPool::Index::iterator BlockPool::best_fit(StreamId stream, size_t size) {
  ExactSlot& slot = exact_slot(stream, size);
  if (slot.owns(stream, size) && slot.lowest != nullptr) return slot.lowest->position;
  auto it = lower_bound(stream, size);
  const bool found = it != free_blocks.end() && it->stream == stream;
  const bool exact = found && it->size == size;
  if (exact || !slot.owns(stream, size)) {  // take the slot over (Note [exact-size table])
    slot.stream = stream, slot.size = size;
    set_lowest(slot, exact ? it->block : nullptr);
  }
  return found ? it : free_blocks.end();
}

}  // namespace amem
