// size_policy_test.cpp — torch's size classes: round_size (512 B steps and
// roundup_power2_divisions), pool choice, segment sizes, and should_split.
#include <gtest/gtest.h>

#include "core/size_policy.h"

namespace amem {
namespace {

const Options kDefaults{};

// ---------------------------------------------------------------- rounding to 512 B

TEST(RoundSize, BelowMinimumRoundsTo512) {
  for (size_t s = 0; s < kMinBlockSize; ++s) ASSERT_EQ(round_size(s, kDefaults), 512u) << s;
  EXPECT_EQ(round_size(512, kDefaults), 512u);
}

TEST(RoundSize, NextMultipleOf512) {
  EXPECT_EQ(round_size(513, kDefaults), 1024u);
  EXPECT_EQ(round_size(1024, kDefaults), 1024u);
  EXPECT_EQ(round_size(1025, kDefaults), 1536u);
  EXPECT_EQ(round_size(kMiB - 1, kDefaults), kMiB);
  EXPECT_EQ(round_size(kMiB, kDefaults), kMiB);
  EXPECT_EQ(round_size(kMiB + 1, kDefaults), kMiB + 512);
  EXPECT_EQ(round_size(30 * kMiB + 7, kDefaults), 30 * kMiB + 512);
}

TEST(RoundSize, EveryResultIsAMultipleOf512AtLeastTheRequest) {
  for (size_t s = 1; s < 64 * kKiB; s += 37) {
    size_t r = round_size(s, kDefaults);
    ASSERT_EQ(r % kMinBlockSize, 0u) << s;
    ASSERT_GE(r, s);
    ASSERT_LT(r - s, kMinBlockSize) << s;
  }
}

// ---------------------------------------------------------------- pools and segments

TEST(PoolFor, OneMiBIsSmallOneMiBPlusOneIsLarge) {
  EXPECT_EQ(pool_for(round_size(1, kDefaults)), PoolKind::kSmall);
  EXPECT_EQ(pool_for(round_size(kMiB, kDefaults)), PoolKind::kSmall);
  EXPECT_EQ(pool_for(round_size(kMiB + 1, kDefaults)), PoolKind::kLarge);
  EXPECT_EQ(pool_for(round_size(100 * kMiB, kDefaults)), PoolKind::kLarge);
}

TEST(SegmentSize, TorchTable) {
  EXPECT_EQ(segment_size_for(512), 2 * kMiB);
  EXPECT_EQ(segment_size_for(kMiB), 2 * kMiB);
  EXPECT_EQ(segment_size_for(kMiB + 512), 20 * kMiB);
  EXPECT_EQ(segment_size_for(10 * kMiB - 512), 20 * kMiB);
  EXPECT_EQ(segment_size_for(10 * kMiB), 10 * kMiB);       // >= 10 MiB: rounded to 2 MiB
  EXPECT_EQ(segment_size_for(10 * kMiB + 512), 12 * kMiB);
  EXPECT_EQ(segment_size_for(21 * kMiB), 22 * kMiB);
  EXPECT_EQ(segment_size_for(22 * kMiB), 22 * kMiB);
  EXPECT_EQ(segment_size_for(kGiB + 512), kGiB + 2 * kMiB);
}

// ---------------------------------------------------------------- power-of-two divisions

TEST(RoundupPower2, TorchExamples) {
  EXPECT_EQ(roundup_power2_next_division(1200, 4), 1280u);  // step 256 in [1024, 2048)
  EXPECT_EQ(roundup_power2_next_division(1280, 4), 1280u);  // already on a step
  EXPECT_EQ(roundup_power2_next_division(1281, 4), 1536u);
  EXPECT_EQ(roundup_power2_next_division(kMiB + 1, 4), kMiB + 256 * kKiB);
  EXPECT_EQ(roundup_power2_next_division(kMiB + 1, 8), kMiB + 128 * kKiB);
  EXPECT_EQ(roundup_power2_next_division(3 * kMiB + 1, 2), 4 * kMiB);
  EXPECT_EQ(roundup_power2_next_division(3, 4), 4u);  // step would be 0: next power of two
}

TEST(RoundupPower2, PowersOfTwoUnchanged) {
  for (size_t shift = 0; shift < 40; ++shift)
    for (size_t d : {2u, 4u, 8u, 16u})
      ASSERT_EQ(roundup_power2_next_division(size_t{1} << shift, d), size_t{1} << shift);
}

TEST(RoundupPower2, ResultIsOnAStepAndNotBelowRequest) {
  for (size_t s = 1025; s < 300000; s += 997) {
    size_t r = roundup_power2_next_division(s, 8);
    size_t floor_pow2 = size_t{1} << (63 - __builtin_clzll(s));
    ASSERT_GE(r, s);
    ASSERT_EQ((r - floor_pow2) % (floor_pow2 / 8), 0u) << s;
    ASSERT_LT(r - s, floor_pow2 / 8) << s;
  }
}

TEST(RoundSize, UsesDivisionsFromOptions) {
  Options o = Options::parse("roundup_power2_divisions:4");
  EXPECT_EQ(round_size(100, o), 512u);
  EXPECT_EQ(round_size(1200, o), 1536u);  // not above 512 * 4: plain 512 B rounding
  EXPECT_EQ(round_size(4600, o), 5120u);  // [4096, 8192) in steps of 1024
  EXPECT_EQ(round_size(4600, kDefaults), 4608u);
  EXPECT_EQ(round_size(3 * kMiB + 1, o), 3 * kMiB + 512 * kKiB);
  EXPECT_EQ(round_size(3 * kMiB + 1, kDefaults), 3 * kMiB + 512);
  EXPECT_EQ(round_size(8 * kMiB, o), 8 * kMiB);
}

TEST(RoundSize, DivisionsPerInterval) {
  // 1-2 MiB interval (and below) off; 2-4 MiB in halves; all above in eighths.
  Options o = Options::parse("roundup_power2_divisions:[1:0,2:2,>:8]");
  EXPECT_EQ(round_size(kMiB + 1, o), kMiB + 512);
  EXPECT_EQ(round_size(2 * kMiB + 1, o), 3 * kMiB);
  EXPECT_EQ(round_size(4 * kMiB + 1, o), 4 * kMiB + 512 * kKiB);
  EXPECT_EQ(round_size(kGiB + 1, o), kGiB + 128 * kMiB);
}

// ---------------------------------------------------------------- should_split

TEST(ShouldSplit, SmallKeepsRemaindersOfAtLeast512) {
  EXPECT_TRUE(should_split(PoolKind::kSmall, 2 * kMiB, 2 * kMiB - 512, kDefaults));
  EXPECT_FALSE(should_split(PoolKind::kSmall, 2 * kMiB, 2 * kMiB, kDefaults));
  EXPECT_TRUE(should_split(PoolKind::kSmall, 1024, 512, kDefaults));
}

TEST(ShouldSplit, LargeNeedsMoreThanOneMiBLeft) {
  EXPECT_FALSE(should_split(PoolKind::kLarge, 20 * kMiB, 19 * kMiB, kDefaults));  // exactly 1 MiB
  EXPECT_TRUE(should_split(PoolKind::kLarge, 20 * kMiB, 19 * kMiB - 512, kDefaults));
  EXPECT_FALSE(should_split(PoolKind::kLarge, 20 * kMiB, 20 * kMiB, kDefaults));
  EXPECT_TRUE(should_split(PoolKind::kLarge, 200 * kMiB, 100 * kMiB, kDefaults));
}

TEST(ShouldSplit, LargeOnlyBelowMaxSplitSize) {
  Options o = Options::parse("max_split_size_mb:40");
  EXPECT_TRUE(should_split(PoolKind::kLarge, 80 * kMiB, 40 * kMiB - 512, o));
  EXPECT_FALSE(should_split(PoolKind::kLarge, 80 * kMiB, 40 * kMiB, o));
  EXPECT_FALSE(should_split(PoolKind::kLarge, 80 * kMiB, 50 * kMiB, o));
  // The small pool ignores max_split_size.
  EXPECT_TRUE(should_split(PoolKind::kSmall, 2 * kMiB, 512, o));
}

}  // namespace
}  // namespace amem
