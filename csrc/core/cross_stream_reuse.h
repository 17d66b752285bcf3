// cross_stream_reuse.h — which free block may serve a request on another stream.
//
// Design note
// -----------
// With cross_stream_reuse off (torch's rule) a free block serves only requests
// on its own segment's stream. With it on, a block freed on one stream may
// serve another once the frees before it are ordered (Note [cross-stream
// reuse] in stream_fences.h: each free marks a fence; wait mode waits for its
// event, handover makes the requesting stream wait on the device).
// CrossStreamReuse is that mechanism, over StreamFences:
//
//   note_free        a block became free on the stream it was last used on:
//                    its fence is marked (no event during a capture);
//   reusable_by      whether a block may serve a request on a stream now;
//   find_foreign     the best fit among the pool's other streams' free
//                    blocks, when the request's own stream has none;
//   settle           the block is taken: handover orders the request's
//                    stream after each foreign fence; the fences are cleared.
//
// A block keeps the fences of every piece merged into it (absorb_fences), and
// the rest of a split copies them (share_fences). No event may be recorded or
// waited on while a capture is under way (Note [private pools]), so no block
// with a foreign fence is reused then. The allocator decides when to ask;
// best fit on the request's own stream and torch's oversize rules stay its
// own. Called under the allocator's lock.
#pragma once

#include "backend.h"
#include "block.h"
#include "options.h"
#include "pool_set.h"
#include "stream_fences.h"

namespace amem {

class CrossStreamReuse {
 public:
  CrossStreamReuse(Backend& device, const PoolSet& pools, const Options& options)
      : mode_(options.cross_stream_reuse),
        options_(options),
        pools_(pools),
        fences_(device, options.cross_stream_reuse == CrossStream::kWait) {}
  CrossStreamReuse(const CrossStreamReuse&) = delete;
  CrossStreamReuse& operator=(const CrossStreamReuse&) = delete;

  bool on() const { return mode_ != CrossStream::kOff; }

  // ------------------------------------------------------------ frees
  // `block` became free: the work queued on its last stream must pass before another stream takes it.
  void note_free(Block* block) {
    add_fence(block, fences_.mark(block->used_on, !pools_.capturing()));  // no event during a capture
  }
  // One fence per stream is enough: a later free on a stream passes after an earlier one.
  static void add_fence(Block* block, Fence fence);
  // `dst` absorbs its neighbour `src`: it waits for whatever `src` waited for.
  static void absorb_fences(Block* dst, const Block* src) {
    for (const Fence& f : src->fences) add_fence(dst, f);
  }
  // `rest`, split off `block`, held the same bytes: it waits for the same frees.
  static void share_fences(const Block* block, Block* rest) {
    if (!block->fences.empty()) rest->fences.assign(block->fences.begin(), block->fences.end());
  }

  // ------------------------------------------------------------ requests
  // Whether `block` may serve a request on `stream` now.
  bool reusable_by(const Block* block, StreamId stream);
  // The best fit for `rounded` among the free blocks of `pool`'s other streams'
  // segments that may serve `stream` now, within torch's oversize rules; or nullptr.
  Block* find_foreign(BlockPool& pool, StreamId stream, size_t rounded);
  // `block` goes to a request on `stream`: order it after the frees on other streams.
  void settle(Block* block, StreamId stream);

  // The device was synchronized: every fence is passed.
  void synchronized() { fences_.synchronized(); }

 private:
  CrossStream mode_;
  const Options& options_;  // the oversize rules
  const PoolSet& pools_;    // whether a capture is under way
  StreamFences fences_;
};

}  // namespace amem
