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
// stream is one lower_bound: O(log n). Set nodes are recycled through
// extract()/insert(node) so the steady state of malloc/free allocates nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "backend.h"
#include "size_policy.h"

namespace amem {

struct Segment;
struct BlockPool;

// A private pool's identity: torch's MempoolId_t (a CUDA graph's or a MemPool's id).
using PoolId = std::pair<uint64_t, uint64_t>;
constexpr PoolId kDefaultPool{0, 0};

struct Block;

// Orders free blocks by (stream, size, address): lower_bound of (stream,
// request, 0) is the best fit on that stream (torch: BlockComparatorSize).
struct BlockLess {
  bool operator()(const Block* a, const Block* b) const;
};

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
  uint64_t alloc_seq = 0;      // allocation sequence number (provenance, traces)
  bool indexed = false;        // in its pool's free index, at `position`
  std::set<Block*, BlockLess>::const_iterator position;  // erase without a search

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
};

inline bool BlockLess::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return a->stream < b->stream;
  if (a->size != b->size) return a->size < b->size;
  return a->address < b->address;
}

// Orders unmapped blocks by (stream, address): the first with room on a stream
// is the lowest address (torch: BlockComparatorAddress).
struct BlockAddressLess {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    return a->address < b->address;
  }
};

struct BlockPool {
  using Index = std::set<Block*, BlockLess>;

  explicit BlockPool(PoolKind k, PoolId owner_id = kDefaultPool) : kind(k), owner(owner_id) {}

  PoolKind kind;
  PoolId owner;                        // kDefaultPool, or the private pool this belongs to
  Index free_blocks;
  std::set<Block*, BlockAddressLess> unmapped;  // expandable segments' unmapped blocks
  uint64_t get_free_block_calls = 0;  // clock for the GC's block ages

  void insert(Block* block);
  void erase(Block* block);
  void take(Index::iterator it);  // erase by position
  // The smallest free block on `stream` of at least `size` bytes, or end().
  Index::iterator best_fit(StreamId stream, size_t size);
  // The first block ordered at or after (stream, size), whatever its stream.
  Index::iterator lower_bound(StreamId stream, size_t size);

 private:
  std::vector<Index::node_type> spare_nodes_;  // recycled set nodes
};

}  // namespace amem
