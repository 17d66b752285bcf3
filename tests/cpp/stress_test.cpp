// stress_test.cpp — the allocator under sustained load, on real host memory.
//
// Concurrency: 8 threads share one allocator (host backend, a memory limit so
// the out-of-memory path and its cache release run while others allocate) and
// do seeded random mallocs and frees of mixed sizes over four shared streams,
// some frees after record_stream. Every live block carries a pattern checked
// before it is freed; a global map of live ranges, updated after malloc and
// before free, catches any overlap between two live blocks exactly, at the
// moment it happens. The is_valid() walker runs while the others work, and at
// stop-the-world checkpoints the counters are compared with the live sets. At
// the end every block is freed and every byte must be back with the backend.
//
// Out of memory, repeatedly: one thread runs into the limit hundreds of times,
// frees, and goes on; after each failure the error names the request, the state
// is valid and the counters are exact; at the end nothing has leaked.
//
// Sizes: 1,000,000 operations per thread by default (about 30 s on 2 cores);
// sanitizer builds (ASan, TSan) run 40,000; AMEM_STRESS_OPS overrides
// both (e.g. AMEM_STRESS_OPS=5000000 for a longer soak).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "test_support.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define AMEM_STRESS_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define AMEM_STRESS_SANITIZED 1
#endif
#endif

namespace amem {
namespace {

using test::stat;

// ================================================================ sizes

#ifdef AMEM_STRESS_SANITIZED
constexpr size_t kDefaultOps = 40000;  // per thread, under a sanitizer
#else
constexpr size_t kDefaultOps = 1000000;  // per thread: the full size (about 30 s on 2 cores)
#endif

size_t ops_per_thread(size_t fallback = kDefaultOps) {
  const char* env = std::getenv("AMEM_STRESS_OPS");
  if (env == nullptr || *env == '\0') return fallback;
  return std::strtoull(env, nullptr, 10);
}

// 60% small (8 B .. 1 MiB, log-uniform), 30% 1 .. 10 MiB, 10% 10 .. 30 MiB.
size_t random_size(std::mt19937_64& rng) {
  unsigned kind = rng() % 10;
  if (kind < 6) return static_cast<size_t>(std::exp2(std::uniform_real_distribution<double>(3.0, 20.0)(rng)));
  if (kind < 9) return std::uniform_int_distribution<size_t>(kMiB, 10 * kMiB)(rng);
  return std::uniform_int_distribution<size_t>(10 * kMiB, 30 * kMiB)(rng);
}

// ================================================================ patterns

struct Live {
  uintptr_t address;
  size_t size;   // requested bytes (>= 8)
  uint64_t tag;  // unique per allocation
};

uint64_t pattern(uint64_t tag, uintptr_t word) {
  uint64_t x = (tag + 1) * 0x9E3779B97F4A7C15ull ^ word;
  return x ^ (x >> 31);
}

// fn(word address) for 3 words of the request: its first, its middle and its
// last whole word. A block touches at most 3 pages (a fresh page costs a
// fault, and segments come and go by the thousand here); the exact overlap
// check is LiveRanges, the pattern catches writes into a block held.
template <class Fn>
void for_each_word(const Live& b, Fn fn) {
  constexpr size_t kWords = 3;
  const size_t last = (b.size - 8) & ~size_t{7};
  for (size_t k = 0; k < kWords; ++k) fn(b.address + (last * k / (kWords - 1) & ~size_t{7}));
}

void write_pattern(const Live& b) {
  for_each_word(b, [&](uintptr_t w) { *reinterpret_cast<uint64_t*>(w) = pattern(b.tag, w); });
}

bool intact(const Live& b) {
  bool ok = true;
  for_each_word(b, [&](uintptr_t w) { ok = ok && *reinterpret_cast<const uint64_t*>(w) == pattern(b.tag, w); });
  return ok;
}

// ================================================================ shared state

// The first failure a worker thread saw (gtest asserts belong to the main thread).
class Failures {
 public:
  void add(const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (count_++ == 0) first_ = what;
  }
  size_t count() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return count_;
  }
  std::string first() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return first_;
  }

 private:
  mutable std::mutex mutex_;
  size_t count_ = 0;
  std::string first_;
};

// Every live range of every thread: an overlap is caught when the second block
// arrives. A range is added after malloc returns and removed before free, so
// any range present belongs to a block its owner still holds.
class LiveRanges {
 public:
  bool add(uintptr_t address, size_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto next = ranges_.lower_bound(address);
    if (next != ranges_.end() && next->first < address + size) return false;
    if (next != ranges_.begin() && std::prev(next)->first + std::prev(next)->second > address) return false;
    ranges_.emplace(address, size);
    return true;
  }
  void remove(uintptr_t address) {
    std::lock_guard<std::mutex> lock(mutex_);
    ranges_.erase(address);
  }

 private:
  std::mutex mutex_;
  std::map<uintptr_t, size_t> ranges_;
};

// A reusable barrier (C++17 has none); the last to arrive returns true.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  bool arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t generation = generation_;
    if (++waiting_ == n_) {
      waiting_ = 0;
      ++generation_;
      cv_.notify_all();
      return true;
    }
    cv_.wait(lock, [&] { return generation_ != generation; });
    return false;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  const int n_;
  int waiting_ = 0;
  uint64_t generation_ = 0;
};

// ================================================================ the concurrency stress

constexpr int kThreads = 8;
constexpr StreamId kStreams = 4;           // shared by all threads
constexpr size_t kMaxLivePerThread = 32;
constexpr size_t kDeviceLimit = 1536 * kMiB;  // the OOM path runs now and then, not all the time
constexpr size_t kWalks = 50;        // walker runs per thread, while the others work
constexpr size_t kCheckpoints = 10;  // stop-the-world checks per run

struct World {
  explicit World(CachingAllocator& allocator) : a(allocator) {}
  CachingAllocator& a;
  LiveRanges ranges;
  Failures failures;
  Barrier barrier{kThreads};
  std::vector<std::vector<Live>> live = std::vector<std::vector<Live>>(kThreads);
  std::atomic<uint64_t> ooms{0};
  std::atomic<uint64_t> mallocs{0};
  std::atomic<uint64_t> checkpoints{0};
};

// With every thread paused: the walker, then the counters against the live
// sets (exact block sizes from block_info), no overlap, every pattern intact.
void check_world(World& w) {
  try {
    w.a.check_valid();
  } catch (const std::exception& e) {
    return w.failures.add(std::string("checkpoint walker: ") + e.what());
  }
  std::vector<std::pair<uintptr_t, size_t>> blocks;
  for (const auto& mine : w.live)
    for (const Live& b : mine) {
      CachingAllocator::BlockInfo info = w.a.block_info(b.address);
      if (info.address != b.address || info.size < b.size) w.failures.add("checkpoint: block_info disagrees");
      if (!intact(b)) w.failures.add("checkpoint: a live block was overwritten");
      blocks.emplace_back(info.address, info.size);
    }
  std::sort(blocks.begin(), blocks.end());
  int64_t bytes = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    bytes += static_cast<int64_t>(blocks[i].second);
    if (i > 0 && blocks[i - 1].first + blocks[i - 1].second > blocks[i].first)
      w.failures.add("checkpoint: two live blocks overlap");
  }
  if (stat(w.a, "allocation.all.current") != static_cast<int64_t>(blocks.size()))
    w.failures.add("checkpoint: allocation.all.current differs from the live blocks");
  if (stat(w.a, "allocated_bytes.all.current") != bytes)
    w.failures.add("checkpoint: allocated_bytes.all.current differs from the live blocks");
  w.checkpoints += 1;
}

void try_malloc(World& w, std::vector<Live>& mine, std::mt19937_64& rng, uint64_t tag) {
  size_t size = std::max<size_t>(8, random_size(rng));
  StreamId stream = rng() % kStreams;
  uintptr_t p = 0;
  try {
    p = w.a.malloc(size, stream);
  } catch (const OutOfMemoryError&) {
    w.ooms += 1;
    return;
  }
  w.mallocs += 1;
  if (p == 0 || p % kMinBlockSize != 0) return w.failures.add("malloc returned a bad address");
  if (!w.ranges.add(p, size)) return w.failures.add("a new block overlaps a live block");
  mine.push_back({p, size, tag});
  write_pattern(mine.back());
}

void free_one(World& w, std::vector<Live>& mine, std::mt19937_64& rng) {
  size_t i = rng() % mine.size();
  Live b = mine[i];
  mine[i] = mine.back();
  mine.pop_back();
  if (!intact(b)) w.failures.add("a block was overwritten while its owner held it");
  w.ranges.remove(b.address);
  if (rng() % 16 == 0) w.a.record_stream(b.address, kStreams + rng() % 2);  // pending until its event
  w.a.free(b.address);
}

// A request larger than the device: the allocator releases its cache (while
// the others allocate) and fails. Natural failures near the limit happen too,
// but how often depends on the interleaving; these happen every run.
void force_out_of_memory(World& w) {
  try {
    w.a.malloc(kDeviceLimit + kMiB, 1);
    w.failures.add("a request larger than the device succeeded");
  } catch (const OutOfMemoryError&) {
    w.ooms += 1;
  }
}

void stress_worker(World& w, int index, size_t ops) {
  std::mt19937_64 rng(7000 + index);
  std::vector<Live>& mine = w.live[index];
  size_t checkpoints = 0;
  try {
    for (size_t op = 1; op <= ops; ++op) {
      bool grow = mine.empty() || (mine.size() < kMaxLivePerThread && rng() % 100 < 55);
      if (grow) try_malloc(w, mine, rng, (uint64_t(index) << 40) | op);
      else free_one(w, mine, rng);
      if (op % (ops / kWalks) == 0) {
        w.a.check_valid();  // under the lock while the others keep going
        if (index == 0) w.a.empty_cache();
        if (index == 1) force_out_of_memory(w);
      }
      if (op % (ops / kCheckpoints) == 0) {
        checkpoints += 1;
        if (w.barrier.arrive_and_wait()) check_world(w);
        w.barrier.arrive_and_wait();
      }
    }
  } catch (const std::exception& e) {
    w.failures.add(std::string("thread ") + std::to_string(index) + ": " + e.what());
    // The others still meet at every checkpoint: this thread keeps arriving.
    for (; checkpoints < kCheckpoints; ++checkpoints) {
      w.barrier.arrive_and_wait();
      w.barrier.arrive_and_wait();
    }
  }
}

// Frees every block (patterns checked), empties the cache, and requires every
// counter back at zero and every byte back with the backend. Expandable
// segments map and unmap pages in runs that need not match one to one, so
// their device alloc/free counts may differ (the bytes may not).
void free_everything(CachingAllocator& a, std::vector<std::vector<Live>>& live, bool expandable) {
  for (auto& mine : live) {
    for (const Live& b : mine) {
      EXPECT_TRUE(intact(b)) << "block " << b.tag << " was overwritten";
      a.free(b.address);
    }
    mine.clear();
  }
  a.check_valid();
  a.empty_cache();
  a.check_valid();
  for (const char* key : {"allocation.all.current", "allocated_bytes.all.current", "active.all.current",
                          "active_bytes.all.current", "requested_bytes.all.current",
                          "reserved_bytes.all.current", "segment.all.current", "inactive_split.all.current"})
    EXPECT_EQ(stat(a, key), 0) << key;
  EXPECT_EQ(stat(a, "allocation.all.allocated"), stat(a, "allocation.all.freed"));
  if (!expandable) {
    EXPECT_EQ(stat(a, "num_device_alloc"), stat(a, "num_device_free"));
  }
  DeviceMemoryInfo info = a.backend().memory_info();
  EXPECT_EQ(info.free_bytes, info.total_bytes) << "bytes still held by the backend";
}

struct StressCase {
  const char* name;
  const char* conf;
  double fraction;  // memory fraction (0 = none)
  size_t divisor;   // runs ops_per_thread() / divisor
};

class ConcurrencyStress : public ::testing::TestWithParam<StressCase> {};

TEST_P(ConcurrencyStress, EightThreadsRandomMixedSizesOverSharedStreams) {
  const StressCase& c = GetParam();
  Options options;
  try {
    options = Options::parse(c.conf);
  } catch (const ConfigError& e) {
    GTEST_SKIP() << "option not available in this build: " << e.what();
  }
  std::unique_ptr<CachingAllocator> a;
  try {
    a = std::make_unique<CachingAllocator>(make_host_backend(kDeviceLimit), options);
  } catch (const ConfigError& e) {
    GTEST_SKIP() << "the host backend does not support " << c.conf << ": " << e.what();
  }
  if (c.fraction > 0) a->set_memory_fraction(c.fraction);
  const size_t ops = std::max<size_t>(ops_per_thread() / c.divisor, 100 * kCheckpoints);
  World w(*a);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(stress_worker, std::ref(w), t, ops);
  for (auto& th : threads) th.join();
  ASSERT_EQ(w.failures.count(), 0u) << w.failures.first();
  std::printf("[ stress   ] %zu ops x %d threads: %" PRIu64 " mallocs, %" PRIu64 " out of memory, %" PRId64
              " segments allocated\n", ops, kThreads, w.mallocs.load(), w.ooms.load(),
              stat(*a, "num_device_alloc"));
  check_world(w);
  ASSERT_EQ(w.failures.count(), 0u) << w.failures.first();
  EXPECT_EQ(w.checkpoints.load(), kCheckpoints + 1);
  EXPECT_EQ(stat(*a, "num_ooms"), static_cast<int64_t>(w.ooms.load()));
  EXPECT_EQ(stat(*a, "allocation.all.allocated"), static_cast<int64_t>(w.mallocs.load()));
  EXPECT_GE(w.ooms.load(), kWalks) << "at least the forced failures";
  EXPECT_LT(w.ooms.load(), w.mallocs.load() / 10) << "but not most of the time";
  free_everything(*a, w.live, std::string(c.conf).find("expandable") != std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Confs, ConcurrencyStress,
    ::testing::Values(StressCase{"defaults", "", 0.0, 1},
                      StressCase{"every_option", "max_split_size_mb:40,roundup_power2_divisions:4,garbage_collection_threshold:0.7", 0.9, 4},
                      StressCase{"expandable", "expandable_segments:True", 0.0, 4},
                      StressCase{"cross_stream_wait", "cross_stream_reuse:wait", 0.0, 4},
                      StressCase{"amem_mechanisms", "expandable_segments:True,large_page_mb:2,small_pool:False,"
                                 "page_reclaim_age:0,cross_stream_reuse:handover", 0.0, 4},
                      // the `amem` policy, what amem_alloc.enable() uses (amem_alloc/policies.py)
                      StressCase{"amem_policy", "expandable_segments:True,cross_stream_reuse:handover,large_page_mb:10,fine_pages_mb:128,map_ahead:2,page_reclaim_age:4,page_reclaim_min_mb:32",
                                 0.0, 4}),
    [](const ::testing::TestParamInfo<StressCase>& info) { return std::string(info.param.name); });

// ================================================================ out of memory, repeatedly

struct OomCase {
  const char* name;
  const char* conf;
  double fraction;
};

class OutOfMemoryRepeatedly : public ::testing::TestWithParam<OomCase> {};

// Fills the device until malloc fails, frees about half of what it holds (in
// random order), and again, until it has failed `kOoms` times.
TEST_P(OutOfMemoryRepeatedly, HitsTheLimitFreesAndGoesOn) {
  constexpr int64_t kOoms = 300;
  const OomCase& c = GetParam();
  Options options;
  try {
    options = Options::parse(c.conf);
  } catch (const ConfigError& e) {
    GTEST_SKIP() << "option not available in this build: " << e.what();
  }
  CachingAllocator a(make_host_backend(96 * kMiB), options);
  if (c.fraction > 0) a.set_memory_fraction(c.fraction);
  std::mt19937_64 rng(4242);
  std::vector<Live> live;
  int64_t ooms = 0, mallocs = 0, bytes = 0;  // bytes: block sizes held
  uint64_t tag = 0;
  while (ooms < kOoms) {
    size_t size = std::max<size_t>(8, random_size(rng));
    StreamId stream = rng() % 3;
    try {
      uintptr_t p = a.malloc(size, stream);
      mallocs += 1;
      bytes += static_cast<int64_t>(a.block_info(p).size);
      live.push_back({p, size, ++tag});
      write_pattern(live.back());
      continue;
    } catch (const OutOfMemoryError& e) {
      ooms += 1;
      const std::string what = e.what();
      ASSERT_NE(what.find("out of memory"), std::string::npos) << what;
      ASSERT_NE(what.find(std::to_string(round_size(size, a.options())) + " bytes"), std::string::npos)
          << "the error names the request: " << what;
    }
    a.check_valid();
    ASSERT_EQ(stat(a, "num_ooms"), ooms);
    ASSERT_EQ(stat(a, "allocation.all.current"), static_cast<int64_t>(live.size()));
    ASSERT_EQ(stat(a, "allocated_bytes.all.current"), bytes);
    std::shuffle(live.begin(), live.end(), rng);
    for (size_t keep = live.size() / 2; live.size() > keep;) {
      const Live& b = live.back();
      ASSERT_TRUE(intact(b)) << "block " << b.tag << " was overwritten";
      bytes -= static_cast<int64_t>(a.block_info(b.address).size);
      a.free(b.address);
      live.pop_back();
    }
    a.check_valid();
  }
  EXPECT_EQ(stat(a, "num_ooms"), kOoms);
  EXPECT_EQ(stat(a, "allocation.all.allocated"), mallocs);
  EXPECT_GT(mallocs, 5 * kOoms) << "most requests should succeed between failures";
  std::vector<std::vector<Live>> all{live};
  free_everything(a, all, std::string(c.conf).find("expandable") != std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Confs, OutOfMemoryRepeatedly,
    ::testing::Values(OomCase{"defaults", "", 0.0},
                      OomCase{"max_split_size", "max_split_size_mb:20", 0.0},
                      OomCase{"garbage_collection", "garbage_collection_threshold:0.5", 0.75},
                      OomCase{"expandable", "expandable_segments:True", 0.0},
                      OomCase{"amem_mechanisms", "expandable_segments:True,large_page_mb:2,small_pool:False,"
                              "page_reclaim_age:0,cross_stream_reuse:handover", 0.0},
                      OomCase{"amem_policy", "expandable_segments:True,cross_stream_reuse:handover,large_page_mb:10,fine_pages_mb:128,map_ahead:2,page_reclaim_age:4,page_reclaim_min_mb:32", 0.0}),
    [](const ::testing::TestParamInfo<OomCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace amem
