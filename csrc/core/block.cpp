// block.cpp — the free-block index (see block.h; the hot members are inline there).
#include "block.h"

namespace amem {

void BlockPool::insert(Block* block) {
  block->free_since = get_free_block_calls;  // the GC measures age from here
  FreeEntry entry = entry_of(block);
  // Note [index fingers]: right before the block that followed it, if still there.
  const Block* hint = block->index_hint;
  const bool hinted = hint != nullptr && hint->indexed && hint->pool == this;
  Index::iterator where;
  if (spare_nodes_.empty()) {
    where = hinted ? free_blocks.insert(hint->position, entry) : free_blocks.insert(entry).first;
  } else {
    auto node = std::move(spare_nodes_.back());
    spare_nodes_.pop_back();
    node.value() = entry;
    where = hinted ? free_blocks.insert(hint->position, std::move(node))
                   : free_blocks.insert(std::move(node)).position;
  }
  block->indexed = true;
  block->position = where;
  recent_[recent_slot(block->stream, block->size)] = block;
}

// The entry at `at` gets a key that sorts elsewhere: move its node there.
BlockPool::Index::iterator BlockPool::move_entry(Index::iterator at, const FreeEntry& entry) {
  auto node = free_blocks.extract(at);
  node.value() = entry;
  return free_blocks.insert(std::move(node)).position;
}

}  // namespace amem
