// caching_allocator.cpp — malloc, free and releasing memory (see the design
// note in caching_allocator.h). Introspection lives in introspect.cpp and the
// invariant walker in validate.cpp.
#include "caching_allocator.h"

#include <algorithm>

#include "merge.h"

namespace amem {

// ================================================================ construction

CachingAllocator::CachingAllocator(std::unique_ptr<Backend> backend, Options options)
    : backend_(std::move(backend)), options_(options) {
  if (options_.expandable_segments && !device_.supports_expandable())
    throw ConfigError("AMEM_CONF: expandable_segments:True cannot be used here: " + device_.why_not_expandable() +
                      "; leave it off on this device");
}

CachingAllocator::~CachingAllocator() {
  Guard guard(*this);
  for (const auto& [address, segment] : segments_.all()) {  // the list deletes the blocks
    if (segment->expandable) device_.release_address_range(segment->address, segment->size);
    else device_.release_segment(segment->address, segment->size);
  }
}

// ================================================================ malloc

uintptr_t CachingAllocator::malloc(size_t size, StreamId stream) {
  if (size == 0) return 0;  // Note [size 0]
  if (size > kMaxRequest)
    throw InvalidRequestError("amem: request of " + std::to_string(size) +
                              " bytes is larger than any device (limit " +
                              std::to_string(kMaxRequest) + " bytes); check the size computation");
  Guard guard(*this);
  ++clock_;
  if (capturing()) drop_failed_captures();  // which may end the capture
  if (!capturing() && !events_.empty()) process_events();  // no event queries during capture
  size_t rounded = round_size(size, options_);
  BlockPool& pool = pools_.serving(pools_.kind_for(rounded), stream);
  Block* block = find_free_block(pool, stream, rounded);
  if (block == nullptr) block = obtain_segment_block(pool, stream, rounded);
  if (block == nullptr) fail_out_of_memory(size, rounded, stream);
  block = split_and_mark_allocated(block, rounded, size, stream);
  if (options_.debug_checks) check_valid_locked();
  return block->address;
}

// Best fit on the same stream, with torch's rules for oversize blocks
// (torch: get_free_block). The block stays in the pool's index:
// split_and_mark_allocated takes it out, or hands its entry to the remainder.
// Inline, as is split_and_mark_allocated: malloc is their one caller, and the
// two calls (saved registers, values reloaded after them) cost the hot pair 47
// instructions (callgrind).
AMEM_INLINE Block* CachingAllocator::find_free_block(BlockPool& pool, StreamId stream, size_t rounded) {
  if (device_.capped() && options_.garbage_collection_threshold > 0.0) ++pool.get_free_block_calls;
  auto it = pool.best_fit(stream, rounded);
  // No cross-stream handover while capturing: no event may be recorded or waited on then.
  auto cross = [&] { return cross_.on() && !capturing(); };
  if (it == pool.free_blocks.end()) return cross() ? cross_.find_foreign(pool, stream, rounded) : nullptr;
  if (it->block->segment->expandable) {  // prefer the block with the least unmapped room behind it
    auto room = [](const Block* b) { return b->size + (b->next && !b->next->mapped ? b->next->size : 0); };
    for (auto next = std::next(it); next != pool.free_blocks.end() && next->stream == stream &&
                                    it->block->segment->expandable && room(next->block) < room(it->block);
         ++next)
      it = next;
  }
  Block* block = it->block;
  if (!cross_.on()) return within_oversize_rules(block->size, rounded, options_) ? block : nullptr;
  if (within_oversize_rules(block->size, rounded, options_) && cross_.reusable_by(block, stream)) return block;
  return cross() ? cross_.find_foreign(pool, stream, rounded) : nullptr;  // Note [cross-stream reuse]
}

// No cached block fits: get a new segment, freeing cached memory to make room
// if the backend refuses (torch: the alloc_block / release_* chain in malloc).
Block* CachingAllocator::obtain_segment_block(BlockPool& pool, StreamId stream, size_t rounded) {
  if (device_.capped() && options_.garbage_collection_threshold > 0.0 && !capturing()) garbage_collect_cached_blocks();
  if (Block* b = allocate_segment(pool, stream, rounded, false)) return b;
  if (release_available_cached_blocks(pool, stream, rounded))
    if (Block* b = allocate_segment(pool, stream, rounded, false)) return b;
  if (!capturing() && release_cached_blocks())  // no synchronization during capture
    if (Block* b = allocate_segment(pool, stream, rounded, true)) return b;
  return nullptr;
}

Block* CachingAllocator::allocate_segment(BlockPool& pool, StreamId stream, size_t rounded,
                                          bool is_retry) {
  if (is_retry) stats_.num_alloc_retries += 1;
  // Private pools never expand (Note [private pools]): as in torch, a graph's pool gets plain segments.
  if (options_.expandable_segments && pool.owner == kDefaultPool) return allocate_expandable(pool, stream, rounded);
  size_t size = segment_size_for(rounded);
  uintptr_t address = device_.allocate_segment(size);  // 0 beyond the memory fraction too
  if (address == 0) return nullptr;

  Block* block = segments_.create(pool, stream, address, size, false);
  segment_events_.note(TraceAction::k_segment_alloc, address, size, stream);

  ledger(pool.kind).segment_obtained(size);
  return block;
}

// Carves `rounded` bytes off the front of a free block, which may still be in
// its pool's index (torch: alloc_found_block).
AMEM_INLINE Block* CachingAllocator::split_and_mark_allocated(Block* block, size_t rounded, size_t requested,
                                                              StreamId stream) {
  BlockPool& pool = *block->pool;
  const bool expandable = block->segment->expandable;
  const bool split = expandable ? block->size - rounded >= kMinBlockSize
                                : should_split(pool.kind, block->size, rounded, options_);
  Ledger books = ledger(pool.kind);
  books.remove<Shape::kFree>(block);
  if (split) {
    Block* rest = segments_.insert_after(block, block->address + rounded, block->size - rounded);
    block->size = rounded;
    books.add<Shape::kFreePiece>(rest);
    CrossStreamReuse::share_fences(block, rest);  // its bytes were used where the block's were
    rest->idle_since = block->idle_since;
    if (block->indexed) pool.replace(block, rest);  // Note [index hand-over]
    else pool.insert(rest);
  } else {
    pool.erase(block);
  }
  if (cross_.on()) cross_.settle(block, stream);
  block->used_on = stream;
  block->allocated = true;
  block->requested = requested;
  block->alloc_seq = ++alloc_seq_;
  allocated_.insert(block->address, block);
  books.add<Shape::kAllocated>(block);
  books.post();
  if (trace_.on())
    trace_.record(TraceAction::k_alloc, block->address, requested, block->size, stream, block->alloc_seq);
  if (stats_.reserved_bytes.current() == stats_.reserved_bytes.peak())  // Note [fragmentation at the peak]
    stats_.allocated_at_reserved_peak =
        std::max(stats_.allocated_at_reserved_peak, stats_.allocated_bytes.current());
  return block;
}

// ================================================================ expandable segments

// A growth is charged what a plain segment for the request would take
// (device_limit.h); idle pages go back first if that keeps the peak down
// (Note [page reclaim]), never during a capture.
Block* CachingAllocator::allocate_expandable(BlockPool& pool, StreamId stream, size_t rounded) {
  if (!device_.admits(segment_size_for(rounded))) return nullptr;
  if (!capturing() && reclaim_.wanted(rounded)) reclaim_idle_pages(rounded);
  return expandable_.allocate(pool, stream, rounded);
}

// Unmapping must not take pages the device may still use: one synchronization.
void CachingAllocator::reclaim_idle_pages(size_t wanted) {
  if (!reclaim_.possible(wanted, clock_)) return;
  synchronize_and_free_events();  // may free and merge blocks: the pages are picked afterwards
  synchronize_device();
  reclaim_.unmap_idle(wanted, clock_);
}

// ================================================================ free

// The caller is done with the block at `address`: it is no longer allocated,
// though it stays active until free_block makes it reusable. (The address is
// the caller's, so the address map hashes it once for the lookup and the erase.)
AMEM_INLINE void CachingAllocator::mark_freed(uintptr_t address, Block* block) {
  allocated_.erase(address);
  Ledger books = ledger(block->pool->kind);
  books.remove<Shape::kAllocated>(block);
  block->allocated = false;
  books.add<Shape::kFreed>(block);
  books.post();
  if (trace_.on())
    trace_.record(TraceAction::k_free_requested, block->address, block->requested, block->size,
                  block->used_on, block->alloc_seq);  // Note [traced stream]
}

void CachingAllocator::free(uintptr_t address) {
  if (address == 0) return;  // Note [size 0]
  Guard guard(*this);
  Block* block = allocated_.find(address);
  if (block == nullptr) {
    stats_.num_invalid_frees += 1;
    throw InvalidFreeError(describe_bad_pointer("free", address));
  }
  if (block->stream_uses.empty()) {
    mark_freed(address, block);
    free_block(block);
  } else {
    free_used_elsewhere(block);
  }
  if (options_.debug_checks) check_valid_locked();
}

// Frees a block that other streams used (Note [record_stream]): it waits on
// an event per stream, or, during a capture, for the capture's end (Note
// [private pools]). The events are recorded first: if the device refuses,
// nothing has changed yet.
void CachingAllocator::free_used_elsewhere(Block* block) {
  if (capturing()) {
    mark_freed(block->address, block);
    block->pending_events += 1;
    deferred_.push_back(block);
    return;
  }
  StreamEvents events = record_stream_events(block);
  mark_freed(block->address, block);
  insert_events(block, std::move(events));
}

// Returns a block to its pool, merged with free neighbours (torch: free_block).
void CachingAllocator::free_block(Block* block) {
  BlockPool& pool = *block->pool;
  if (trace_.on())  // before merging, as torch records it
    trace_.record(TraceAction::k_free_completed, block->address, block->requested, block->size,
                  block->used_on, block->alloc_seq);
  Ledger books = ledger(pool.kind);
  books.remove<Shape::kFreed>(block);
  merge_free_neighbour(block, block->prev, pool, books, segments_);
  merge_free_neighbour(block, block->next, pool, books, segments_);
  if (!block->indexed) pool.insert(block);  // else it took a neighbour's entry (merge.h)
  if (cross_.on()) cross_.note_free(block);
  block->idle_since = clock_;
  block->requested = 0;  // requested bytes count until the block is reusable (torch)
  books.add<Shape::kFree>(block);
  books.post();
}

void CachingAllocator::record_stream(uintptr_t address, StreamId stream) {
  Guard guard(*this);
  Block* block = allocated_.find(address);
  if (block == nullptr) throw InvalidFreeError(describe_bad_pointer("record_stream on", address));
  if (stream == block->stream) return;  // its own stream orders itself
  auto& uses = block->stream_uses;
  if (std::find(uses.begin(), uses.end(), stream) == uses.end()) uses.push_back(stream);
}

// An event on each stream that used `block`, all or none: a failure destroys
// those already recorded and rethrows, with nothing else changed.
CachingAllocator::StreamEvents CachingAllocator::record_stream_events(const Block* block) {
  StreamEvents events;
  try {
    for (StreamId s : block->stream_uses) events.emplace_back(s, device_.record_event(s));
  } catch (...) {
    for (auto& [stream, event] : events) device_.destroy_event(event);
    throw;
  }
  return events;
}

void CachingAllocator::insert_events(Block* block, StreamEvents events) {
  for (auto& [stream, event] : events) events_.add(stream, event, block);
  block->stream_uses.clear();
}

// Frees the blocks whose every pending event has completed (event_queue.h).
void CachingAllocator::process_events() {
  events_.poll([this](Block* b) { free_block(b); });
}

// Waits for each pending event, not for the whole device: only what is
// pending is waited for, and with nothing pending nothing waits (torch does the same).
void CachingAllocator::synchronize_and_free_events() {
  stats_.num_sync_all_streams += 1;
  events_.wait_all([this](Block* b) { free_block(b); });
}

// ================================================================ releasing memory

void CachingAllocator::empty_cache() {
  Guard guard(*this);
  if (capturing()) drop_failed_captures();
  stats_.num_empty_cache += 1;
  if (trace_.on()) trace_.record(TraceAction::k_empty_cache, 0, 0, 0, 0, 0);
  release_cached_blocks();
  if (options_.debug_checks) check_valid_locked();
}

// Frees every cached whole segment (torch: release_cached_blocks). While a
// capture is under way nothing may wait for the device: the shared pools keep
// their memory, and only pools no graph uses any more give theirs back.
bool CachingAllocator::release_cached_blocks() {
  if (!capturing()) {
    synchronize_and_free_events();
    release_pool_segments(pools_.shared(PoolKind::kLarge));
    release_pool_segments(pools_.shared(PoolKind::kSmall));
  }
  release_freeable_private_pools();
  return true;
}

void CachingAllocator::release_pool_segments(BlockPool& pool) {
  std::vector<Block*> whole, expandable;
  for (const FreeEntry& entry : pool.free_blocks) {
    Block* b = entry.block;
    if (b->segment->expandable) expandable.push_back(b);
    else if (!b->is_split()) whole.push_back(b);
  }
  for (Block* b : whole) release_segment_of(b);  // cudaFree waits for the device itself
  if (!expandable.empty()) synchronize_device();  // unmapping does not: wait first (torch too)
  for (Block* b : expandable) expandable_.unmap_block(b);
}

void CachingAllocator::synchronize_device() {
  device_.synchronize();
  cross_.synchronized();
}

// `block` is free and spans its whole segment (torch: release_block).
void CachingAllocator::release_segment_of(Block* block) {
  Segment* segment = block->segment;
  BlockPool& pool = *block->pool;
  segment_events_.note(TraceAction::k_segment_free, segment->address, segment->size,
                       segment->stream);  // before the backend call, as torch records it
  device_.release_segment(segment->address, segment->size);
  ledger(pool.kind).segment_released(segment->size);
  pool.erase(block);
  segments_.destroy(block);
}

// With max_split_size set, frees oversize cached blocks of the request's stream
// until the request could fit (torch: release_available_cached_blocks).
bool CachingAllocator::release_available_cached_blocks(BlockPool& pool, StreamId stream,
                                                       size_t rounded) {
  if (options_.max_split_size == SIZE_MAX) return false;
  size_t key_size = std::max(rounded, options_.max_split_size);
  auto it = pool.lower_bound(stream, key_size);
  if (it != pool.free_blocks.end() && it->stream == stream && !it->block->segment->expandable) {
    if (it->block->is_split()) return false;
    release_segment_of(it->block);  // one oversize block is enough
    return true;
  }
  // No single block is enough: free this stream's oversize blocks, largest
  // first, until their sizes add up to the request.
  std::vector<Block*> victims;
  size_t released = 0;
  while (released < key_size && it != pool.free_blocks.begin()) {
    Block* b = (--it)->block;
    if (b->stream != stream || b->size < options_.max_split_size) break;
    if (b->is_split() || b->segment->expandable) continue;
    victims.push_back(b);
    released += b->size;
  }
  for (Block* b : victims) release_segment_of(b);
  return released >= key_size;
}

// Frees cached whole large segments older than the average, repeatedly, until
// reserved memory is back under the threshold (torch: garbage_collect_cached_blocks).
void CachingAllocator::garbage_collect_cached_blocks() {
  auto threshold = static_cast<size_t>(options_.garbage_collection_threshold *
                                       static_cast<double>(device_.allowed_bytes()));
  auto reserved = static_cast<size_t>(stats_.reserved_bytes.current());
  if (reserved <= threshold) return;
  size_t target = reserved - threshold;
  const BlockPool& large = pools_.shared(PoolKind::kLarge);
  auto age = [&](const Block* b) { return large.get_free_block_calls - b->free_since; };
  uint64_t total_age = 0;
  size_t freeable = 0;
  auto collectable = [](const Block* b) { return !b->is_split() && !b->segment->expandable; };
  for (const FreeEntry& e : large.free_blocks)
    if (collectable(e.block)) total_age += age(e.block), ++freeable;
  if (freeable == 0) return;
  synchronize_and_free_events();
  size_t reclaimed = 0;
  bool freed_one = true;
  while (reclaimed < target && freed_one && freeable > 0) {
    double age_threshold = static_cast<double>(total_age) / static_cast<double>(freeable);
    freed_one = false;
    std::vector<Block*> old;
    for (const FreeEntry& e : large.free_blocks)
      if (collectable(e.block) && static_cast<double>(age(e.block)) >= age_threshold) old.push_back(e.block);
    for (Block* b : old) {
      freed_one = true;
      reclaimed += b->size;
      total_age -= age(b);
      --freeable;
      release_segment_of(b);
    }
  }
}

void CachingAllocator::set_memory_fraction(double fraction) {
  Guard guard(*this);
  device_.set_fraction(fraction);
}

// ================================================================ recording

void CachingAllocator::start_trace(size_t max_entries) {
  Guard guard(*this);
  trace_.start(max_entries);
}

void CachingAllocator::stop_trace() {
  Guard guard(*this);
  trace_.stop();
}

void CachingAllocator::clear_trace() {
  Guard guard(*this);
  trace_.clear();
}

bool CachingAllocator::tracing() const {
  Guard guard(*this);
  return trace_.on();
}

std::string CachingAllocator::trace_json() const {
  Guard guard(*this);
  return trace_.to_json();
}

void CachingAllocator::set_segment_log(std::vector<SegmentEvent>* log) {
  Guard guard(*this);
  segment_events_.set_log(log);
}

}  // namespace amem
