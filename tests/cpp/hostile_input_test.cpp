// hostile_input_test.cpp — bad input of every kind gets a clear error, never a
// crash, and leaves the allocator as it was: floods of unknown, interior,
// misaligned and double frees; sizes at and past the limit; bad memory
// fractions and trace sizes; and a seeded fuzz of AMEM_CONF strings (random
// bytes and mutations of valid strings) that may only parse or throw
// ConfigError. Under the sanitizer builds (make test-sanitize) these also prove
// that no bad input reads or writes out of bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <iterator>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "test_support.h"

namespace amem {
namespace {

using test::stat;

// ================================================================ frees of what is not ours

// Addresses near, inside and between the live blocks and segments, and far away.
std::vector<uintptr_t> hostile_addresses(CachingAllocator& a, const std::vector<uintptr_t>& live,
                                         std::mt19937_64& rng) {
  std::vector<uintptr_t> out = {1, 8, 511, 512, 4096, UINTPTR_MAX, UINTPTR_MAX - 511,
                                uintptr_t{1} << 63, 0x7f0000000000};
  for (uintptr_t p : live) {
    size_t size = a.block_info(p).size;
    for (uintptr_t d : {uintptr_t{1}, uintptr_t{8}, uintptr_t{511}, uintptr_t{512}, size - 1, size, size + 512})
      out.push_back(p + d);
    out.push_back(p - 1);
    out.push_back(p - 512);
  }
  for (const test::SegmentView& s : test::segments(a)) {
    out.push_back(s.address + s.total_size);
    out.push_back(s.address + s.total_size - kMinBlockSize);
  }
  for (int i = 0; i < 2000; ++i) out.push_back(rng());
  std::set<uintptr_t> mine(live.begin(), live.end());
  std::vector<uintptr_t> hostile;
  for (uintptr_t p : out)
    if (p != 0 && mine.count(p) == 0) hostile.push_back(p);
  return hostile;
}

class HostileFrees : public ::testing::TestWithParam<const char*> {};

TEST_P(HostileFrees, NeverFreeAnythingAndChangeOnlyTheCounter) {
  auto a = std::string(GetParam()) == "host" ? test::make_host(0) : test::make_sim();
  std::mt19937_64 rng(99);
  std::vector<uintptr_t> live;
  for (size_t size : {size_t{1}, size_t{4096}, 700 * kKiB, 3 * kMiB, 12 * kMiB + 1})
    for (StreamId s : {StreamId{0}, StreamId{5}}) live.push_back(a->malloc(size, s));
  uintptr_t gone = a->malloc(8192, 0);
  a->free(gone);  // a double free from now on
  std::vector<uintptr_t> hostile = hostile_addresses(*a, live, rng);
  hostile.push_back(gone);

  const auto before = test::stats_without(*a, "num_invalid_frees");
  const std::string layout = a->segments_json();
  for (uintptr_t p : hostile) {
    EXPECT_THROW(a->free(p), InvalidFreeError) << std::hex << p;
    EXPECT_THROW(a->record_stream(p, 3), InvalidFreeError) << std::hex << p;
  }
  a->check_valid();
  EXPECT_EQ(test::stats_without(*a, "num_invalid_frees"), before);
  EXPECT_EQ(a->segments_json(), layout);
  EXPECT_EQ(stat(*a, "num_invalid_frees"), static_cast<int64_t>(hostile.size()));
  for (uintptr_t p : live) a->free(p);  // the real blocks are still ours to free
  a->empty_cache();
  a->check_valid();
  EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), 0);
  for (uintptr_t p : live) EXPECT_THROW(a->free(p), InvalidFreeError);  // gone with their segments
}

INSTANTIATE_TEST_SUITE_P(Backends, HostileFrees, ::testing::Values("sim", "host"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

// ================================================================ sizes

TEST(HostileSizes, PastTheLimitIsAnInvalidRequestAndChangesNothing) {
  auto a = test::make_sim(64 * kMiB);
  uintptr_t keep = a->malloc(1000, 0);
  const std::string stats = a->stats_json(), layout = a->segments_json();
  for (size_t size : {kMaxRequest + 1, kMaxRequest + kMinBlockSize, SIZE_MAX, SIZE_MAX - 511,
                      size_t{1} << 63, static_cast<size_t>(-1024)}) {
    try {
      a->malloc(size, 0);
      ADD_FAILURE() << "malloc(" << size << ") returned";
    } catch (const InvalidRequestError& e) {
      EXPECT_NE(std::string(e.what()).find("larger than any device"), std::string::npos) << e.what();
    }
  }
  a->check_valid();
  EXPECT_EQ(a->stats_json(), stats);
  EXPECT_EQ(a->segments_json(), layout);
  a->free(keep);
}

TEST(HostileSizes, HugeButValidRequestsAreOutOfMemoryAndTheAllocatorCarriesOn) {
  for (const char* conf : {"", "roundup_power2_divisions:16", "roundup_power2_divisions:[1:4,>:1024]",
                           "max_split_size_mb:20"}) {
    for (bool host : {false, true}) {
      auto a = host ? test::make_host(256 * kMiB, conf) : test::make_sim(256 * kMiB, conf);
      uintptr_t keep = a->malloc(3 * kMiB, 0);
      for (size_t size : {kMaxRequest, kMaxRequest - 1, size_t{1} << 50, (size_t{1} << 46) + 1, 300 * kMiB})
        EXPECT_THROW(a->malloc(size, 7), OutOfMemoryError) << conf << " " << size;
      a->check_valid();
      EXPECT_EQ(stat(*a, "num_ooms"), 5);
      uintptr_t p = a->malloc(5 * kMiB, 7);  // still serves what fits
      a->free(p);
      a->free(keep);
      a->empty_cache();
      a->check_valid();
      EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), 0);
    }
  }
}

TEST(HostileSizes, RoundingNeverOverflowsNorUndershoots) {
  std::mt19937_64 rng(5);
  for (const char* conf : {"", "roundup_power2_divisions:1", "roundup_power2_divisions:2",
                           "roundup_power2_divisions:64", "roundup_power2_divisions:[1:4,64:16,>:1024]",
                           "roundup_power2_divisions:4294967296"}) {  // the most accepted
    Options o = Options::parse(conf);
    std::vector<size_t> sizes;
    for (int bit = 0; bit <= 56; ++bit)
      for (size_t delta : {size_t{0}, size_t{1}}) {
        size_t p = size_t{1} << bit;
        sizes.push_back(p - delta);
        sizes.push_back(p + delta);
      }
    for (int i = 0; i < 20000; ++i) sizes.push_back(rng() % kMaxRequest + 1);
    for (size_t size : sizes) {
      if (size == 0 || size > kMaxRequest) continue;
      size_t r = round_size(size, o);
      ASSERT_GE(r, size) << conf << " size " << size;
      ASSERT_EQ(r % kMinBlockSize, 0u) << conf << " size " << size;
      ASSERT_LE(r, 2 * size + kMinBlockSize) << conf << " size " << size;
      ASSERT_GE(segment_size_for(r), r) << conf << " size " << size;
    }
  }
}

// More divisions than kMaxRoundupDivisions would overflow round_size's
// 512 * divisions: the parser refuses them and says what it accepts.
TEST(HostileSizes, TooManyRoundupDivisionsAreRefused) {
  for (const char* conf : {"roundup_power2_divisions:8589934592", "roundup_power2_divisions:9223372036854775808",
                           "roundup_power2_divisions:[1:4,>:9223372036854775808]"}) {
    try {
      Options::parse(conf);
      FAIL() << conf << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("at most 4294967296 divisions"), std::string::npos) << e.what();
    }
  }
}

// ================================================================ other arguments

TEST(HostileArguments, BadMemoryFractionsAndTraceSizesAreRefused) {
  auto a = test::make_sim(64 * kMiB);
  uintptr_t keep = a->malloc(1000, 0);
  const std::string stats = a->stats_json();
  for (double f : {std::nan(""), -1.0, -1e-9, 1.0 + 1e-9, 2.0, std::numeric_limits<double>::infinity(),
                   -std::numeric_limits<double>::infinity()})
    EXPECT_THROW(a->set_memory_fraction(f), std::invalid_argument) << f;
  EXPECT_THROW(a->start_trace(0), std::invalid_argument);
  EXPECT_FALSE(a->tracing());
  a->check_valid();
  EXPECT_EQ(a->stats_json(), stats);
  uintptr_t p = a->malloc(60 * kMiB, 0);  // no cap was set by the refused fractions
  a->free(p);
  a->free(keep);
}

TEST(HostileArguments, AnyStreamIdIsJustAStream) {
  auto a = test::make_sim();
  std::vector<uintptr_t> live;
  for (StreamId s : {StreamId{0}, StreamId{1}, ~StreamId{0}, StreamId{1} << 63, StreamId{0xdeadbeef}})
    live.push_back(a->malloc(1000, s));
  a->record_stream(live[0], ~StreamId{0});
  for (uintptr_t p : live) a->free(p);
  a->empty_cache();
  a->check_valid();
  EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), 0);
}

// ================================================================ AMEM_CONF fuzz

const char* const kValidConfs[] = {
    "",
    "max_split_size_mb:40",
    "max_split_size_mb:unlimited,max_non_split_rounding_mb:64",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
    "garbage_collection_threshold:0.6,debug_checks:True",
    "max_split_size_mb:200, roundup_power2_divisions:[1:8,>:2], garbage_collection_threshold:0.25",
};

constexpr char kAlphabet[] = ":,[]> 0123456789.-+eExXnNaAifu_\t\n\"'\\\x00\x7f\xff\xc3";

std::string mutate(std::string s, std::mt19937_64& rng) {
  int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    size_t at = s.empty() ? 0 : rng() % (s.size() + 1);
    char c = kAlphabet[rng() % (sizeof kAlphabet - 1)];
    switch (rng() % 5) {
      case 0: s.insert(s.begin() + at, c); break;
      case 1: if (at < s.size()) s.erase(at, 1 + rng() % 3); break;
      case 2: if (at < s.size()) s[at] = c; break;
      case 3: if (at < s.size()) s.insert(at, s.substr(at, rng() % 12)); break;  // repeat a piece
      default: s.insert(at, std::to_string(rng() >> (rng() % 64))); break;      // a number, maybe huge
    }
  }
  return s;
}

std::string random_bytes(std::mt19937_64& rng) {
  std::string s(rng() % 40, '\0');
  for (char& c : s) c = rng() % 3 ? kAlphabet[rng() % (sizeof kAlphabet - 1)] : static_cast<char>(rng());
  return s;
}

// What every parsed Options must satisfy, whatever text it came from.
void expect_sane(const Options& o, const std::string& conf) {
  EXPECT_GE(o.max_split_size, kLargeBuffer) << conf;
  EXPECT_GE(o.max_non_split_rounding_size, kLargeBuffer) << conf;
  EXPECT_TRUE(o.garbage_collection_threshold >= 0.0 && o.garbage_collection_threshold < 1.0) << conf;
  for (size_t d : o.roundup_power2_divisions) EXPECT_EQ(d & (d - 1), 0u) << conf;
  // The canonical text is a fixed point: it parses back to itself.
  std::string canonical = o.to_string();
  EXPECT_EQ(Options::parse(canonical).to_string(), canonical) << conf;
}

TEST(ConfFuzz, OnlyConfigErrorOrSuccess) {
  std::mt19937_64 rng(2026);
  size_t accepted = 0, refused = 0;
  for (int i = 0; i < 60000; ++i) {
    std::string conf = i % 4 == 0 ? random_bytes(rng)
                                  : mutate(kValidConfs[rng() % std::size(kValidConfs)], rng);
    try {
      Options o = Options::parse(conf);
      ++accepted;
      expect_sane(o, conf);
      if (accepted % 200 == 0) {  // and the core works with what was accepted
        CachingAllocator a(make_sim_backend(256 * kMiB), o);
        for (size_t size : {size_t{1000}, 3 * kMiB, 30 * kMiB}) a.free(a.malloc(size, 0));
        a.check_valid();
      }
    } catch (const ConfigError& e) {
      ++refused;
      ASSERT_EQ(std::string(e.what()).rfind("AMEM_CONF: ", 0), 0u) << "error without context: " << e.what();
    } catch (const std::exception& e) {
      FAIL() << "AMEM_CONF '" << conf << "' threw something other than ConfigError: " << e.what();
    }
    if (HasFailure()) return;
  }
  EXPECT_GT(accepted, 1000u);
  EXPECT_GT(refused, 10000u);
}

}  // namespace
}  // namespace amem
