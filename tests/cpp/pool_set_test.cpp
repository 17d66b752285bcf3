// pool_set_test.cpp — which pool serves a request: the shared pools by size
// (one pool without small_pool), allocate-to-pool scopes routing the streams
// their filter takes, scopes of failed captures closed, and owners' pools
// freeable once released as often as scopes named them.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "core/pool_set.h"

namespace amem {
namespace {

constexpr PoolId kGraph{1, 1};
constexpr PoolId kOther{2, 0};

TEST(PoolSet, SharedPoolsBySizeAndOnePoolWithoutSmallPool) {
  PoolSet pools(true);
  EXPECT_EQ(pools.kind_for(kMiB), PoolKind::kSmall);
  EXPECT_EQ(pools.kind_for(kMiB + kMinBlockSize), PoolKind::kLarge);
  EXPECT_EQ(&pools.serving(PoolKind::kSmall, 7), &pools.shared(PoolKind::kSmall));
  EXPECT_EQ(pools.shared(PoolKind::kLarge).kind, PoolKind::kLarge);
  EXPECT_EQ(pools.shared(PoolKind::kLarge).owner, kDefaultPool);
  EXPECT_FALSE(pools.capturing());
  PoolSet one(false);
  EXPECT_EQ(one.kind_for(kMinBlockSize), PoolKind::kLarge);
}

TEST(PoolSet, AScopeServesOnlyTheStreamsItsFilterTakes) {
  PoolSet pools(true);
  pools.open_scope(kGraph, [](StreamId s) { return s == 5; });
  EXPECT_TRUE(pools.capturing());
  BlockPool& routed = pools.serving(PoolKind::kLarge, 5);
  EXPECT_EQ(routed.owner, kGraph);
  EXPECT_EQ(routed.kind, PoolKind::kLarge);
  EXPECT_EQ(&routed, &pools.private_pool(kGraph, PoolKind::kLarge));
  EXPECT_EQ(&pools.serving(PoolKind::kLarge, 6), &pools.shared(PoolKind::kLarge));
  EXPECT_EQ(pools.private_count(), 1u);
  EXPECT_TRUE(pools.ids_are_true());
}

TEST(PoolSet, TheFirstOpenScopeThatTakesTheStreamWins) {
  PoolSet pools(true);
  pools.open_scope(kGraph, [](StreamId s) { return s == 5; });
  pools.open_scope(kOther, [](StreamId) { return true; });
  EXPECT_EQ(pools.serving(PoolKind::kSmall, 5).owner, kGraph);
  EXPECT_EQ(pools.serving(PoolKind::kSmall, 9).owner, kOther);
  EXPECT_FALSE(pools.close_scope(kGraph));  // kOther's scope is still open
  EXPECT_EQ(pools.serving(PoolKind::kSmall, 5).owner, kOther);
  EXPECT_TRUE(pools.close_scope(kOther));   // the last one
  EXPECT_FALSE(pools.capturing());
  EXPECT_FALSE(pools.close_scope(kOther));  // none left to close
}

TEST(PoolSet, AScopeWhoseServedStreamsStoppedCapturingIsDropped) {
  PoolSet pools(true);
  bool capturing = true;
  pools.open_scope(kGraph, [&](StreamId s) { return capturing && s == 5; });
  EXPECT_FALSE(pools.drop_failed_captures());  // has served nothing yet: stays
  pools.serving(PoolKind::kSmall, 5);
  EXPECT_FALSE(pools.drop_failed_captures());  // its stream still captures
  capturing = false;                            // the capture failed; no end_allocate_to_pool
  EXPECT_TRUE(pools.drop_failed_captures());
  EXPECT_FALSE(pools.capturing());
  EXPECT_EQ(pools.private_count(), 1u);         // the pool itself stays until released
}

TEST(PoolSet, APoolIsFreeableOnceReleasedForEveryScopeThatNamedIt) {
  PoolSet pools(true);
  pools.open_scope(kGraph, [](StreamId) { return true; });
  pools.open_scope(kGraph, [](StreamId) { return true; });
  pools.close_scope(kGraph);
  pools.close_scope(kGraph);
  EXPECT_TRUE(pools.freeable().empty());
  pools.release(kGraph);
  EXPECT_TRUE(pools.freeable().empty());
  pools.release(kGraph);
  EXPECT_EQ(pools.freeable(), std::vector<PoolId>{kGraph});
  pools.release(kGraph);   // once more: stays freeable, no underflow
  pools.release(kOther);   // unknown: ignored
  EXPECT_EQ(pools.freeable(), std::vector<PoolId>{kGraph});
  EXPECT_TRUE(pools.has_private(kGraph));
  pools.erase(kGraph);
  EXPECT_FALSE(pools.has_private(kGraph));
  EXPECT_EQ(pools.private_count(), 0u);
}

TEST(PoolSet, AllListsTheSharedPoolsThenEachPrivatePoolOnce) {
  PoolSet pools(true);
  pools.open_scope(kOther, [](StreamId) { return true; });
  pools.open_scope(kGraph, [](StreamId) { return true; });
  const std::vector<const BlockPool*> all = pools.all();
  ASSERT_EQ(all.size(), 6u);
  EXPECT_EQ(all[0], &pools.shared(PoolKind::kSmall));
  EXPECT_EQ(all[1], &pools.shared(PoolKind::kLarge));
  EXPECT_EQ(all[2]->owner, kGraph);  // id order
  EXPECT_EQ(all[4]->owner, kOther);
  EXPECT_EQ(std::set<const BlockPool*>(all.begin(), all.end()).size(), 6u);
}

}  // namespace
}  // namespace amem
