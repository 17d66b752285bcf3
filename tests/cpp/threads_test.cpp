// threads_test.cpp — one allocator (sim backend) shared by 8 threads, each on
// its own stream with its own live set, doing seeded random malloc/free while
// others read stats and run the walker. Afterwards: no two live blocks
// overlap, the counters match the live sets, and every byte comes back.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "test_support.h"

namespace amem {
namespace {

using test::stat;

constexpr int kThreads = 8;
constexpr int kOpsPerThread = 20000;

struct Live {
  uintptr_t address;
  size_t size;  // rounded block size
};

size_t random_size(std::mt19937_64& rng) {
  switch (rng() % 8) {
    case 0: return std::uniform_int_distribution<size_t>(kMiB, 10 * kMiB)(rng);
    case 1: return std::uniform_int_distribution<size_t>(10 * kMiB, 30 * kMiB)(rng);
    default: return std::uniform_int_distribution<size_t>(1, kMiB)(rng);
  }
}

constexpr StreamId kBusyStreams[2] = {900, 901};  // flipped busy/idle by another thread

// One thread's work; failures are recorded in `errors` (gtest asserts are not
// for threads other than the main one). With `record`, a quarter of the frees
// follow a record_stream on a stream another thread keeps flipping busy.
void worker(CachingAllocator& a, int index, int ops, bool record, std::vector<Live>& live,
            std::atomic<int>& errors) {
  std::mt19937_64 rng(1000 + index);
  const StreamId stream = 100 + index;
  for (int op = 0; op < ops; ++op) {
    if (live.empty() || (live.size() < 64 && rng() % 2)) {
      size_t size = random_size(rng);
      uintptr_t p = a.malloc(size, stream);
      CachingAllocator::BlockInfo info = a.block_info(p);
      if (p == 0 || info.address != p || info.stream != stream || info.size < size) ++errors;
      live.push_back({p, info.size});
    } else {
      size_t i = rng() % live.size();
      if (record && rng() % 4 == 0) a.record_stream(live[i].address, kBusyStreams[rng() % 2]);
      a.free(live[i].address);
      live[i] = live.back();
      live.pop_back();
    }
    if (op % 2000 == 0) {
      a.check_valid();         // the walker under the lock, while others wait
      (void)a.stats_json();
      if (index == 0) a.empty_cache();
    }
  }
}

TEST(Threads, EightThreadsShareOneAllocator) {
  auto a = test::make_sim();
  std::vector<std::vector<Live>> live(kThreads);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back(worker, std::ref(*a), t, kOpsPerThread, false, std::ref(live[t]),
                         std::ref(errors));
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  a->check_valid();

  std::vector<Live> all;
  for (const auto& l : live) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end(), [](const Live& x, const Live& y) { return x.address < y.address; });
  for (size_t i = 1; i < all.size(); ++i)
    ASSERT_GE(all[i].address, all[i - 1].address + all[i - 1].size) << "blocks overlap";
  size_t bytes = 0;
  for (const Live& b : all) bytes += b.size;
  EXPECT_EQ(stat(*a, "allocation.all.current"), static_cast<int64_t>(all.size()));
  EXPECT_EQ(stat(*a, "allocated_bytes.all.current"), static_cast<int64_t>(bytes));

  for (const Live& b : all) a->free(b.address);
  a->check_valid();
  EXPECT_EQ(stat(*a, "allocated_bytes.all.current"), 0);
  EXPECT_EQ(stat(*a, "active_bytes.all.current"), 0);
  a->empty_cache();
  a->check_valid();
  EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), 0);
  EXPECT_EQ(stat(*a, "num_device_alloc"), stat(*a, "num_device_free"));
  EXPECT_EQ(stat(*a, "allocation.all.allocated"), stat(*a, "allocation.all.freed"));
}

TEST(Threads, RecordStreamWhileAnotherThreadFlipsStreams) {
  auto a = test::make_sim();
  SimulatedBackend& streams = test::streams_of(*a);
  std::vector<std::vector<Live>> live(4);
  std::atomic<int> errors{0};
  std::atomic<bool> done{false};
  streams.set_stream_busy(kBusyStreams[0], true);  // busy throughout: its blocks stay pending
  std::thread flipper([&] {                          // flips the other one as fast as it can
    for (uint64_t n = 0; !done.load(); ++n) {
      streams.set_stream_busy(kBusyStreams[1], n % 2 == 0);
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back(worker, std::ref(*a), t, 5000, true, std::ref(live[t]), std::ref(errors));
  for (auto& th : threads) th.join();
  done = true;
  flipper.join();
  EXPECT_EQ(errors.load(), 0);
  a->check_valid();
  EXPECT_GT(stat(*a, "active_bytes.all.current"), stat(*a, "allocated_bytes.all.current"))
      << "some freed blocks should still wait on a busy stream";

  for (const auto& l : live)
    for (const Live& b : l) a->free(b.address);
  for (StreamId s : kBusyStreams) streams.set_stream_busy(s, false);
  a->empty_cache();  // synchronizes: every pending block completes
  a->check_valid();
  EXPECT_EQ(stat(*a, "active_bytes.all.current"), 0);
  EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), 0);
  EXPECT_EQ(stat(*a, "num_device_alloc"), stat(*a, "num_device_free"));
}

}  // namespace
}  // namespace amem
