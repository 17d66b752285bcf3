// block.cpp — the free-block index (see block.h).
#include "block.h"

namespace amem {

void BlockPool::insert(Block* block) {
  block->free_since = get_free_block_calls;  // the GC measures age from here
  Index::iterator where;
  if (spare_nodes_.empty()) {
    where = free_blocks.insert(block).first;
  } else {
    auto node = std::move(spare_nodes_.back());
    spare_nodes_.pop_back();
    node.value() = block;
    where = free_blocks.insert(std::move(node)).position;
  }
  block->indexed = true;
  block->position = where;
}

void BlockPool::erase(Block* block) {
  if (block->indexed) take(block->position);
}

void BlockPool::take(Index::iterator it) {
  (*it)->indexed = false;
  spare_nodes_.push_back(free_blocks.extract(it));
}

BlockPool::Index::iterator BlockPool::lower_bound(StreamId stream, size_t size) {
  Block key;
  key.stream = stream;
  key.size = size;
  return free_blocks.lower_bound(&key);
}

BlockPool::Index::iterator BlockPool::best_fit(StreamId stream, size_t size) {
  auto it = lower_bound(stream, size);
  if (it == free_blocks.end() || (*it)->stream != stream) return free_blocks.end();
  return it;
}

}  // namespace amem
