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
  note_added(entry);
}

bool BlockPool::exact_table_is_true() const {
  for (const FreeEntry& e : free_blocks) {  // a flagged block is its slot's lowest
    const ExactSlot& slot = exact_slot(e.stream, e.size);
    if (e.block->exact_lowest != (slot.lowest == e.block)) return false;
  }
  for (const ExactSlot& slot : exact_) {
    if (slot.size == 0) continue;
    auto it = free_blocks.lower_bound(FreeEntry{slot.stream, slot.size, 0, nullptr});
    const bool exact = it != free_blocks.end() && it->stream == slot.stream && it->size == slot.size;
    if (slot.lowest != (exact ? it->block : nullptr)) return false;
  }
  return true;
}

// The entry at `at` gets a key that sorts elsewhere: move its node there.
BlockPool::Index::iterator BlockPool::move_entry(Index::iterator at, const FreeEntry& entry) {
  auto node = free_blocks.extract(at);
  node.value() = entry;
  return free_blocks.insert(std::move(node)).position;
}

}  // namespace amem
