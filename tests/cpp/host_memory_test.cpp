// host_memory_test.cpp — the policy against real memory (host backend): every
// live block carries a pattern unique to it, checked before it is freed, over
// a seeded random sequence of mixed sizes on three streams with a memory limit
// (so OOMs happen and the cache is released under pressure), and a shorter one
// with record_stream and busy streams, where a block pending on a busy stream
// must keep its bytes. A premature reuse breaks a pattern; an overlap between
// held blocks is caught exactly by a map of their ranges.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "test_support.h"

namespace amem {
namespace {

using test::stat;

struct Live {
  uintptr_t address;
  size_t size;
  uint64_t tag;  // unique per allocation
};

// The pattern word at `word` (an address) of the block tagged `tag`.
uint64_t pattern(uint64_t tag, uintptr_t word) {
  uint64_t x = (tag + 1) * 0x9E3779B97F4A7C15ull ^ word;
  return x ^ (x >> 29);
}

// Whether the block's last byte lies outside every pattern word.
bool last_byte_is_free(const Live& b) { return (b.size - 1) % kMinBlockSize >= 8; }

// Calls fn(address) for each pattern word: every 512 B in the first and last
// 8 KiB of the block, every 64 KiB between (512-aligned, so a word of one
// block never straddles a block boundary). Sparse in the middle to keep page
// faults down; overlaps are caught exactly by the range map in LiveSet.
template <class Fn>
void for_each_word(const Live& b, Fn fn) {
  const size_t edge = 8 * kKiB, stride = 64 * kKiB;
  for (size_t off = 0; off + 8 <= b.size;) {
    fn(b.address + off);
    bool middle = off + kMinBlockSize >= edge && off + stride + edge <= b.size;
    off += middle ? stride : kMinBlockSize;
  }
}

void write_pattern(const Live& b) {
  for_each_word(b, [&](uintptr_t w) { *reinterpret_cast<uint64_t*>(w) = pattern(b.tag, w); });
  if (last_byte_is_free(b))
    *reinterpret_cast<unsigned char*>(b.address + b.size - 1) = static_cast<unsigned char>(b.tag);
}

// The first address whose pattern is broken, or 0 when intact.
uintptr_t broken_at(const Live& b) {
  uintptr_t broken = 0;
  for_each_word(b, [&](uintptr_t w) {
    if (broken == 0 && *reinterpret_cast<const uint64_t*>(w) != pattern(b.tag, w)) broken = w;
  });
  if (broken == 0 && last_byte_is_free(b) &&
      *reinterpret_cast<const unsigned char*>(b.address + b.size - 1) != static_cast<unsigned char>(b.tag))
    broken = b.address + b.size - 1;
  return broken;
}

// 60% small (512 B .. 1 MiB, log-uniform), 30% 1 .. 10 MiB, 10% 10 .. 30 MiB.
size_t random_size(std::mt19937_64& rng) {
  unsigned kind = rng() % 10;
  if (kind < 6) {
    std::uniform_real_distribution<double> exponent(9.0, 20.0);
    return static_cast<size_t>(std::exp2(exponent(rng)));
  }
  if (kind < 9) return std::uniform_int_distribution<size_t>(kMiB, 10 * kMiB)(rng);
  return std::uniform_int_distribution<size_t>(10 * kMiB, 30 * kMiB)(rng);
}

// The blocks a test holds, and their block ranges to catch any overlap exactly.
struct LiveSet {
  std::vector<Live> blocks;
  std::map<uintptr_t, size_t> ranges;  // block address -> block size (rounded)

  void hold(uintptr_t address, size_t block_size) {
    auto next = ranges.lower_bound(address);
    uintptr_t limit = next == ranges.end() ? UINTPTR_MAX : next->first;
    uintptr_t floor = next == ranges.begin() ? 0 : std::prev(next)->first + std::prev(next)->second;
    EXPECT_LE(address + block_size, limit) << "the block overlaps the next held block";
    EXPECT_LE(floor, address) << "the block overlaps the previous held block";
    ranges[address] = block_size;
  }
};

// Checks blocks[i]'s pattern, frees it and forgets it; its range stays held
// when `keep_range` (a block other streams still use).
void check_and_free(CachingAllocator& a, LiveSet& live, size_t i, bool keep_range = false) {
  Live b = live.blocks[i];
  ASSERT_EQ(broken_at(b), 0u) << "block " << b.tag << " was overwritten";
  a.free(b.address);
  live.blocks[i] = live.blocks.back();
  live.blocks.pop_back();
  if (!keep_range) live.ranges.erase(b.address);
}

// Allocates and patterns a block; false on OutOfMemoryError.
bool try_allocate(CachingAllocator& a, LiveSet& live, size_t size, StreamId stream, uint64_t tag) {
  uintptr_t p = 0;
  try {
    p = a.malloc(size, stream);
  } catch (const OutOfMemoryError&) {
    return false;
  }
  CachingAllocator::BlockInfo info = a.block_info(p);
  EXPECT_EQ(info.address, p);
  EXPECT_EQ(p % kMinBlockSize, 0u);
  EXPECT_GE(info.size, size);
  live.hold(p, info.size);
  live.blocks.push_back({p, size, tag});
  write_pattern(live.blocks.back());
  return true;
}

void free_everything(CachingAllocator& a, LiveSet& live) {
  while (!live.blocks.empty()) {
    check_and_free(a, live, live.blocks.size() - 1);
    if (::testing::Test::HasFatalFailure()) return;
  }
  a.empty_cache();
  a.check_valid();
  EXPECT_EQ(stat(a, "reserved_bytes.all.current"), 0);
  EXPECT_EQ(stat(a, "allocated_bytes.all.current"), 0);
  EXPECT_EQ(stat(a, "active_bytes.all.current"), 0);
  EXPECT_EQ(stat(a, "requested_bytes.all.current"), 0);
  EXPECT_EQ(stat(a, "num_device_alloc"), stat(a, "num_device_free"));
}

TEST(HostMemory, RandomSequenceKeepsEveryBlockIntact) {
  auto a = test::make_host(256 * kMiB);
  std::mt19937_64 rng(20240611);
  LiveSet live;
  size_t ooms = 0, allocations = 0;
  for (uint64_t op = 0; op < 50000; ++op) {
    bool grow = live.blocks.empty() || (live.blocks.size() < 40 && rng() % 100 < 55);
    if (grow) {
      StreamId stream = rng() % 3;
      if (try_allocate(*a, live, random_size(rng), stream, op)) ++allocations;
      else ++ooms;
    } else {
      check_and_free(*a, live, rng() % live.blocks.size());
      if (HasFatalFailure()) return;
    }
    if (op % 10007 == 10006) a->empty_cache();
    a->check_valid();
  }
  EXPECT_GT(ooms, 0u) << "the limit should bite sometimes";
  EXPECT_LT(ooms, allocations / 20) << "but not most of the time";
  EXPECT_EQ(stat(*a, "num_ooms"), static_cast<int64_t>(ooms));
  EXPECT_GT(stat(*a, "num_alloc_retries"), static_cast<int64_t>(ooms));  // some retries succeed
  free_everything(*a, live);
}

// Blocks freed after record_stream on a busy stream stay held until the stream
// goes idle: their bytes must survive, and no new block may overlap them.
TEST(HostMemory, PendingBlocksKeepTheirBytesUntilTheStreamIsIdle) {
  auto a = test::make_host(0);  // no limit: no OOM release, so only idling completes events
  std::mt19937_64 rng(77);
  LiveSet live;
  std::vector<Live> pending[2];  // pending on busy stream 10 or 11
  auto stream_finishes = [&](StreamId s) {
    for (const Live& b : pending[s - 10]) {
      EXPECT_EQ(broken_at(b), 0u) << "pending block " << b.tag << " was overwritten";
      live.ranges.erase(b.address);
    }
    pending[s - 10].clear();
    test::streams_of(*a).set_stream_busy(s, false);
  };
  for (StreamId s : {10, 11}) test::streams_of(*a).set_stream_busy(s, true);
  for (uint64_t op = 1; op <= 6000; ++op) {
    if (op % 200 == 0) {
      StreamId s = 10 + (op / 200) % 2;
      stream_finishes(s);
      test::streams_of(*a).set_stream_busy(s, true);
    }
    if (live.blocks.empty() || (live.blocks.size() < 24 && rng() % 2)) {
      size_t size = rng() % 4 ? rng() % (64 * kKiB) + 512 : rng() % (8 * kMiB) + kMiB;
      try_allocate(*a, live, size, rng() % 2, op);
    } else {
      size_t i = rng() % live.blocks.size();
      Live b = live.blocks[i];
      StreamId other = 10 + rng() % 2;
      bool deferred = rng() % 3 == 0;
      if (deferred) a->record_stream(b.address, other);
      check_and_free(*a, live, i, deferred);
      if (HasFatalFailure()) return;
      if (deferred) pending[other - 10].push_back(b);
    }
    a->check_valid();
  }
  EXPECT_EQ(stat(*a, "num_sync_all_streams"), 0);
  for (StreamId s : {10, 11}) stream_finishes(s);
  free_everything(*a, live);
}

}  // namespace
}  // namespace amem
