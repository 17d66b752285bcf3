// bench_core.cpp — micro-benchmarks of the policy core, called directly (no Python).
//
// Design note
// -----------
// Each figure is a set of variants measured in the same run, interleaved: for
// every repetition, each variant is timed once, in turn, so drift in the
// machine (frequency, other load) hits every variant alike and the ratios
// between them are fair. A repetition times many iterations with
// std::chrono::steady_clock and divides; the driver (benchmarks/run.py) takes
// the median over repetitions and the median of the per-repetition ratios.
// One untimed warm-up repetition runs first.
//
//   hot_path   a cached malloc+free pair, one thread: the block comes from the
//              pool's index, is split off a cached segment and merged back
//              (small: 1000 B; large: 3 MiB), on the sim and host backends.
//   holes      the same pair with N free blocks in the pool that cannot merge:
//              one big large-pool segment carved into hole, separator, hole, ...
//              of distinct hole sizes; the holes are freed, and the pair asks for
//              a size that exactly matches one hole (best fit, no split): the
//              middle one, or (holes_spread) 10 spread over the index in turn.
//   threads    pairs on 1, 2, 4, 8 threads, each on its own stream, sharing one
//              allocator (and its lock); the same total work for every count.
//   recording  the hot pair on the host backend with recording off and on
//              (start_trace(max_entries); the ring wraps in steady state), and
//              one read of the trace clock alone (what each recorded call pays
//              for its timestamp).
//   pending    the hot pair (sim) while 0 or 1000 freed blocks wait on a busy
//              stream's events (record_stream): what each malloc's event scan costs.
//
// Output: one JSON object on stdout, {"figures": [{"id", "unit", "samples"}...]},
// samples in repetition order. Nothing here asserts a speed: run.py compares
// with the targets. `--quick` runs few, short repetitions (CI smoke);
// `--profile-hot N` runs N small hot pairs on sim and exits (for callgrind);
// `--profile-holes N` runs N pairs with 64k free holes.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/simulated_streams.h"
#include "core/caching_allocator.h"

namespace amem::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Short repetitions (about 20 ms), many of them: a burst of other work on the
// machine then spoils a few samples of every variant, not a whole figure.
struct Settings {
  int reps = 15;                 // timed repetitions per variant
  size_t pairs = 200000;         // malloc+free pairs per repetition (single thread)
  size_t thread_pairs = 200000;  // pairs per repetition, shared among the threads
  bool quick = false;
};

// A variant times `n` iterations and returns the elapsed nanoseconds.
struct Variant {
  std::string id;
  std::string unit;
  std::function<double(size_t)> run;
  size_t n;
  std::vector<double> samples;
};

// Keeps a computed value alive so the loop producing it is not optimized away.
void sink(uint64_t value) {
  static volatile uint64_t kept;
  kept = value;
}

double elapsed_ns(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double, std::nano>(t1 - t0).count();
}

// Warm-up once, then `reps` rounds timing every variant in turn; each sample is
// the time per iteration.
void measure(std::vector<Variant>& variants, int reps) {
  for (Variant& v : variants) v.run(std::max<size_t>(v.n / 10, 1));
  for (int r = 0; r < reps; ++r)
    for (Variant& v : variants) v.samples.push_back(v.run(v.n) / static_cast<double>(v.n));
}

// ================================================================ workloads

std::unique_ptr<CachingAllocator> make(const char* backend) {
  auto b = std::strcmp(backend, "host") == 0 ? make_host_backend(0) : make_sim_backend(0);
  return std::make_unique<CachingAllocator>(std::move(b), Options::parse(""));
}

// `n` malloc+free pairs of `size` bytes on `stream`; the time in ns.
double pairs(CachingAllocator& a, size_t size, StreamId stream, size_t n) {
  auto t0 = Clock::now();
  for (size_t i = 0; i < n; ++i) {
    uintptr_t p = a.malloc(size, stream);
    a.free(p);
  }
  return elapsed_ns(t0, Clock::now());
}

// One figure of stats_json(), e.g. "inactive_split.large_pool.current".
int64_t stat(const CachingAllocator& a, const std::string& key) {
  std::string json = a.stats_json(), quoted = "\"" + key + "\":";
  size_t at = json.find(quoted);
  return at == std::string::npos ? -1 : std::strtoll(json.c_str() + at + quoted.size(), nullptr, 10);
}

// The segment the pair will use is allocated (and cached) before timing.
std::shared_ptr<CachingAllocator> cached(const char* backend, size_t size) {
  std::shared_ptr<CachingAllocator> a = make(backend);
  a->free(a->malloc(size, 0));
  return a;
}

Variant pair_variant(const std::string& id, std::shared_ptr<CachingAllocator> a, size_t size,
                     size_t n) {
  return {id, "ns/pair", [a, size](size_t k) { return pairs(*a, size, 0, k); }, n, {}};
}

std::vector<Variant> hot_path(const Settings& s) {
  std::vector<Variant> v;
  v.push_back(pair_variant("hot_path.sim.small", cached("sim", 1000), 1000, s.pairs));
  v.push_back(pair_variant("hot_path.host.small", cached("host", 1000), 1000, s.pairs));
  v.push_back(pair_variant("hot_path.sim.large", cached("sim", 3 * kMiB), 3 * kMiB, s.pairs));
  v.push_back(pair_variant("hot_path.host.large", cached("host", 3 * kMiB), 3 * kMiB, s.pairs));
  return v;
}

// ---------------------------------------------------------------- holes

constexpr size_t kSeparator = kMiB + kMinBlockSize;  // large pool, never freed
size_t hole_size(size_t i) { return kMiB + kMinBlockSize * (1 + i); }  // distinct, large pool

// An allocator whose large pool holds exactly `holes` free blocks that cannot
// merge: one segment carved into hole_0, sep, hole_1, sep, ...; the separators
// stay allocated (and in the address map, as live tensors would). Returns the
// size of the middle hole, which the timed pair will hit exactly.
std::shared_ptr<CachingAllocator> with_holes(size_t holes, size_t* target) {
  std::shared_ptr<CachingAllocator> a = make("sim");
  size_t total = 0;
  for (size_t i = 0; i < holes; ++i) total += hole_size(i) + kSeparator;
  a->free(a->malloc(total, 0));  // one cached segment of total rounded up to 2 MiB
  std::vector<uintptr_t> hole_addresses;
  for (size_t i = 0; i < holes; ++i) {
    hole_addresses.push_back(a->malloc(hole_size(i), 0));
    a->malloc(kSeparator, 0);
  }
  // What remains of the segment past the last separator is taken too when it
  // is a block of its own (more than 1 MiB; less is absorbed by the separator).
  size_t rest = (total + kRoundLarge - 1) / kRoundLarge * kRoundLarge - total;
  if (rest > kSmallSize) a->malloc(rest, 0);
  for (uintptr_t p : hole_addresses) a->free(p);
  if (stat(*a, "inactive_split.large_pool.current") != static_cast<int64_t>(holes)) {
    std::fprintf(stderr, "amem_bench: expected %zu free blocks in the pool, found %lld\n", holes,
                 static_cast<long long>(stat(*a, "inactive_split.large_pool.current")));
    std::exit(1);
  }
  *target = hole_size(holes / 2);
  return a;
}

// Pairs that cycle through `sizes` (each an exact hole size).
double pairs_cycling(CachingAllocator& a, const std::vector<size_t>& sizes, size_t n) {
  auto t0 = Clock::now();
  for (size_t i = 0; i < n; ++i) a.free(a.malloc(sizes[i % sizes.size()], 0));
  return elapsed_ns(t0, Clock::now());
}

std::vector<Variant> holes(const Settings& s) {
  std::vector<Variant> v;
  for (size_t n : {size_t{10}, size_t{1000}, size_t{65536}}) {
    size_t target = 0;
    auto a = with_holes(n, &target);
    v.push_back(pair_variant("holes." + std::to_string(n), a, target, s.pairs));
  }
  // The same, but the pairs cycle through 10 holes spread evenly over the
  // index: the middle hole alone sits at the top of the tree, where every
  // neighbour step is longest; spread, the pairs see the positions a
  // workload's sizes would.
  for (size_t n : {size_t{10}, size_t{65536}}) {
    size_t unused = 0;
    auto a = with_holes(n, &unused);
    std::vector<size_t> sizes;
    for (size_t k = 0; k < 10; ++k) sizes.push_back(hole_size(k * n / 10 + n / 20));
    v.push_back({"holes_spread." + std::to_string(n), "ns/pair",
                 [a, sizes](size_t k) { return pairs_cycling(*a, sizes, k); }, s.pairs, {}});
  }
  return v;
}

// ---------------------------------------------------------------- threads

// `total` pairs split among `threads` threads, each on its own stream; the
// wall time from the common start to the last join.
double threaded_pairs(CachingAllocator& a, int threads, size_t total) {
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  const size_t each = total / threads;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&a, &go, t, each] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      pairs(a, 1000, 1 + t, each);
    });
  auto t0 = Clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : pool) th.join();
  return elapsed_ns(t0, Clock::now()) * static_cast<double>(total) /
         static_cast<double>(each * threads);
}

std::vector<Variant> threads(const Settings& s) {
  std::vector<Variant> v;
  for (int n : {1, 2, 4, 8}) {
    std::shared_ptr<CachingAllocator> a = make("sim");
    for (int t = 0; t < n; ++t) a->free(a->malloc(1000, 1 + t));  // one cached segment per stream
    v.push_back({"threads." + std::to_string(n), "ns/pair",
                 [a, n](size_t k) { return threaded_pairs(*a, n, k); }, s.thread_pairs, {}});
  }
  return v;
}

// ---------------------------------------------------------------- recording

std::vector<Variant> recording(const Settings& s) {
  std::shared_ptr<CachingAllocator> a = cached("host", 1000);
  a->start_trace(1 << 16);  // allocate the ring once
  a->stop_trace();
  std::vector<Variant> v;
  v.push_back({"recording.off", "ns/pair", [a](size_t k) {
                 a->stop_trace();
                 return pairs(*a, 1000, 0, k);
               }, s.pairs, {}});
  v.push_back({"recording.on", "ns/pair", [a](size_t k) {
                 a->start_trace(1 << 16);
                 double ns = pairs(*a, 1000, 0, k);
                 a->stop_trace();
                 return ns;
               }, s.pairs, {}});
  v.push_back({"recording.clock", "ns/read", [](size_t k) {
                 uint64_t sum = 0;
                 auto t0 = Clock::now();
                 for (size_t i = 0; i < k; ++i) sum += read_trace_ticks();
                 double ns = elapsed_ns(t0, Clock::now());
                 sink(sum);
                 return ns;
               }, s.pairs, {}});
  return v;
}

// ---------------------------------------------------------------- pending events

// `pending` blocks freed after record_stream on a stream that stays busy, so
// their events never complete; then the timed pair runs on stream 0.
std::shared_ptr<CachingAllocator> with_pending(size_t pending) {
  std::shared_ptr<CachingAllocator> a = cached("sim", 1000);
  dynamic_cast<SimulatedBackend&>(a->backend()).set_stream_busy(99, true);
  std::vector<uintptr_t> blocks;
  for (size_t i = 0; i < pending; ++i) blocks.push_back(a->malloc(1000, 1));
  for (uintptr_t p : blocks) {
    a->record_stream(p, 99);
    a->free(p);
  }
  return a;
}

std::vector<Variant> pending(const Settings& s) {
  std::vector<Variant> v;
  for (size_t n : {size_t{0}, size_t{1000}}) {
    size_t pairs_n = n == 0 ? s.pairs : s.pairs / 100;  // each pair scans every pending event
    v.push_back(pair_variant("pending." + std::to_string(n), with_pending(n), 1000, std::max<size_t>(pairs_n, 100)));
  }
  return v;
}

// ================================================================ output

std::string json_number(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", x);
  return buf;
}

std::string to_json(const std::vector<Variant>& all, const Settings& s) {
  std::string out = "{\"quick\":" + std::string(s.quick ? "true" : "false") +
                    ",\"reps\":" + std::to_string(s.reps) + ",\"figures\":[";
  for (size_t i = 0; i < all.size(); ++i) {
    const Variant& v = all[i];
    out += (i ? "," : "") + std::string("{\"id\":\"") + v.id + "\",\"unit\":\"" + v.unit +
           "\",\"iterations\":" + std::to_string(v.n) + ",\"samples\":[";
    for (size_t k = 0; k < v.samples.size(); ++k) out += (k ? "," : "") + json_number(v.samples[k]);
    out += "]}";
  }
  return out + "]}";
}

int run(int argc, char** argv) {
  Settings s;
  std::vector<std::string> only;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--quick") {
      s.quick = true, s.reps = 3, s.pairs = 20000, s.thread_pairs = 20000;
    } else if (arg == "--profile-hot" && i + 1 < argc) {
      auto a = cached("sim", 1000);
      pairs(*a, 1000, 0, std::strtoull(argv[++i], nullptr, 10));
      return 0;
    } else if (arg == "--profile-holes" && i + 1 < argc) {
      size_t target = 0;
      auto a = with_holes(65536, &target);
      pairs(*a, target, 0, std::strtoull(argv[++i], nullptr, 10));
      return 0;
    } else if (arg == "--only" && i + 1 < argc) {
      only.push_back(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: amem_bench [--quick] [--only hot_path|holes|threads|recording|pending]... "
                   "[--profile-hot N] [--profile-holes N]\n");
      return 2;
    }
  }
  using Group = std::vector<Variant> (*)(const Settings&);
  const std::pair<const char*, Group> groups[] = {
      {"hot_path", hot_path}, {"holes", holes}, {"threads", threads}, {"recording", recording},
      {"pending", pending}};
  std::vector<Variant> all;
  for (const auto& [name, make_group] : groups) {
    if (!only.empty() && std::find(only.begin(), only.end(), name) == only.end()) continue;
    std::vector<Variant> group = make_group(s);
    measure(group, s.reps);
    for (Variant& v : group) all.push_back(std::move(v));
  }
  std::printf("%s\n", to_json(all, s).c_str());
  return 0;
}

}  // namespace
}  // namespace amem::bench

int main(int argc, char** argv) { return amem::bench::run(argc, argv); }
