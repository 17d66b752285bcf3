// options_test.cpp — AMEM_CONF parsing: every option of AMEM_OPTION_TABLE, the
// canonical to_string round trip, torch's bracket syntax for
// roundup_power2_divisions (docs/torch_policy.md §5), and ConfigError for every
// kind of bad input, naming the offending key.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <string>

#include "core/options.h"

namespace amem {
namespace {

// what() of the ConfigError that parsing `conf` throws; "" when it parses.
std::string config_error(const std::string& conf) {
  try {
    Options::parse(conf);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// Asserts `conf` is rejected with a message naming `key`.
void expect_rejected(const std::string& conf, const std::string& key) {
  std::string what = config_error(conf);
  EXPECT_FALSE(what.empty()) << "accepted: " << conf;
  EXPECT_NE(what.find("'" + key + "'"), std::string::npos) << conf << " -> " << what;
}

Divisions filled(size_t v) {
  Divisions d;
  d.fill(v);
  return d;
}

// ---------------------------------------------------------------- the table

TEST(Options, TableListsEveryOptionOnce) {
  std::vector<std::string> names;
#define AMEM_NAME(name, type, field, initial, json, text, doc) names.push_back(#name);
  AMEM_OPTION_TABLE(AMEM_NAME)
#undef AMEM_NAME
  ASSERT_EQ(option_table().size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(option_table()[i].name, names[i]);
    EXPECT_STRNE(option_table()[i].doc, "");
  }
}

TEST(Options, EmptyStringGivesDefaults) {
  Options o = Options::parse("");
  EXPECT_EQ(o.max_split_size, SIZE_MAX);
  EXPECT_EQ(o.max_non_split_rounding_size, 20 * kMiB);
  EXPECT_EQ(o.roundup_power2_divisions, filled(0));
  EXPECT_EQ(o.garbage_collection_threshold, 0.0);
  EXPECT_FALSE(o.debug_checks);
  EXPECT_EQ(o.to_string(), Options{}.to_string());
}

// Each row's default, written as the table writes it, parses to the defaults,
// and to_string() prints every row with its default text.
TEST(Options, TableDefaultsParseAndPrint) {
  const std::string defaults = Options{}.to_string();
  for (const OptionRow& row : option_table()) {
    std::string conf = std::string(row.name) + ":" + row.default_text;
    EXPECT_EQ(Options::parse(conf).to_string(), defaults) << conf;
    EXPECT_NE(defaults.find(conf), std::string::npos) << defaults << " lacks " << conf;
  }
}

// ---------------------------------------------------------------- each option

TEST(Options, MaxSplitSize) {
  EXPECT_EQ(Options::parse("max_split_size_mb:20").max_split_size, 20 * kMiB);
  EXPECT_EQ(Options::parse("max_split_size_mb:1024").max_split_size, kGiB);
  EXPECT_EQ(Options::parse("max_split_size_mb:unlimited").max_split_size, SIZE_MAX);
  EXPECT_EQ(Options::parse("max_split_size_mb:18446744073709551615").max_split_size, SIZE_MAX);
}

TEST(Options, MaxNonSplitRounding) {
  EXPECT_EQ(Options::parse("max_non_split_rounding_mb:64").max_non_split_rounding_size, 64 * kMiB);
  EXPECT_EQ(Options::parse("max_non_split_rounding_mb:20").max_non_split_rounding_size, 20 * kMiB);
}

TEST(Options, RoundupPower2DivisionsSingleValue) {
  EXPECT_EQ(Options::parse("roundup_power2_divisions:8").roundup_power2_divisions, filled(8));
  EXPECT_EQ(Options::parse("roundup_power2_divisions:1").roundup_power2_divisions, filled(1));
  EXPECT_EQ(Options::parse("roundup_power2_divisions:0").roundup_power2_divisions, filled(0));
}

TEST(Options, GarbageCollectionThreshold) {
  EXPECT_DOUBLE_EQ(Options::parse("garbage_collection_threshold:0.75").garbage_collection_threshold,
                   0.75);
  EXPECT_DOUBLE_EQ(Options::parse("garbage_collection_threshold:0.001").garbage_collection_threshold,
                   0.001);
  // 0 is the printed default (off); accepted so that to_string() parses back.
  EXPECT_EQ(Options::parse("garbage_collection_threshold:0").garbage_collection_threshold, 0.0);
}

TEST(Options, DebugChecks) {
  for (const char* yes : {"True", "true", "1"})
    EXPECT_TRUE(Options::parse(std::string("debug_checks:") + yes).debug_checks) << yes;
  for (const char* no : {"False", "false", "0"})
    EXPECT_FALSE(Options::parse(std::string("debug_checks:") + no).debug_checks) << no;
}

TEST(Options, SeveralKeysAndWhitespace) {
  Options o = Options::parse(" max_split_size_mb : 64 ,\tgarbage_collection_threshold:0.5,"
                             "debug_checks:True, roundup_power2_divisions:[4:2,>:4]");
  EXPECT_EQ(o.max_split_size, 64 * kMiB);
  EXPECT_DOUBLE_EQ(o.garbage_collection_threshold, 0.5);
  EXPECT_TRUE(o.debug_checks);
  EXPECT_EQ(o.divisions_for(kMiB), 2u);
  EXPECT_EQ(o.divisions_for(8 * kMiB), 4u);
}

// ---------------------------------------------------------------- bracket lists (torch §5)

TEST(Options, BracketListFollowsTorch) {
  // Entry i covers [2^(20+i), 2^(21+i)) bytes. The first value also fills
  // every entry below it; '>' fills the entries after the last one set.
  Divisions want = filled(1);
  want[9] = 2;
  for (size_t i = 10; i < want.size(); ++i) want[i] = 8;
  EXPECT_EQ(Options::parse("roundup_power2_divisions:[256:1,512:2,>:8]").roundup_power2_divisions,
            want);
}

TEST(Options, BracketListTorchDocExample) {
  Divisions want = filled(4);  // [256:4,512:2,>:1]
  want[9] = 2;
  for (size_t i = 10; i < want.size(); ++i) want[i] = 1;
  EXPECT_EQ(Options::parse("roundup_power2_divisions:[256:4,512:2,>:1]").roundup_power2_divisions,
            want);
}

TEST(Options, BracketListWithoutGreaterLeavesTheRestOff) {
  Divisions want = filled(0);
  for (size_t i = 0; i <= 2; ++i) want[i] = 4;  // 1, 2 and 4 MiB intervals
  EXPECT_EQ(Options::parse("roundup_power2_divisions:[4:4]").roundup_power2_divisions, want);
}

TEST(Options, BracketListClampsHugeIntervals) {
  Options o = Options::parse("roundup_power2_divisions:[1:1,1048576:16]");
  EXPECT_EQ(o.roundup_power2_divisions[15], 16u);
  EXPECT_EQ(o.roundup_power2_divisions[14], 0u);
  EXPECT_EQ(o.roundup_power2_divisions[0], 1u);
}

TEST(Options, GreaterFirstSkipsTheFirstInterval) {
  // torch starts '>' at last_index + 1 with last_index initialised to 0.
  Divisions want = filled(4);
  want[0] = 0;
  EXPECT_EQ(Options::parse("roundup_power2_divisions:[>:4]").roundup_power2_divisions, want);
}

TEST(Options, DivisionsForMapsSizesToIntervals) {
  Options o = Options::parse("roundup_power2_divisions:[1:2,2:4,4:8,>:16]");
  EXPECT_EQ(o.divisions_for(512), 2u);  // below 1 MiB: the first interval
  EXPECT_EQ(o.divisions_for(kMiB), 2u);
  EXPECT_EQ(o.divisions_for(2 * kMiB - 1), 2u);
  EXPECT_EQ(o.divisions_for(2 * kMiB), 4u);
  EXPECT_EQ(o.divisions_for(4 * kMiB), 8u);
  EXPECT_EQ(o.divisions_for(8 * kMiB), 16u);
  EXPECT_EQ(o.divisions_for(size_t{1} << 50), 16u);  // beyond 64 GiB: the last interval
}

// ---------------------------------------------------------------- round trip

TEST(Options, ToStringRoundTrips) {
  for (const char* conf :
       {"", "max_split_size_mb:20", "max_split_size_mb:4096,max_non_split_rounding_mb:100",
        "roundup_power2_divisions:4", "roundup_power2_divisions:[256:1,512:2,>:8]",
        "roundup_power2_divisions:[>:4]", "garbage_collection_threshold:0.6",
        "garbage_collection_threshold:0.123456789", "debug_checks:True",
        "max_split_size_mb:64,roundup_power2_divisions:[2:16],garbage_collection_threshold:0.9,"
        "debug_checks:1"}) {
    Options o = Options::parse(conf);
    Options again = Options::parse(o.to_string());
    EXPECT_EQ(again.to_string(), o.to_string()) << conf;
    EXPECT_EQ(again.max_split_size, o.max_split_size) << conf;
    EXPECT_EQ(again.max_non_split_rounding_size, o.max_non_split_rounding_size) << conf;
    EXPECT_EQ(again.roundup_power2_divisions, o.roundup_power2_divisions) << conf;
    EXPECT_EQ(again.debug_checks, o.debug_checks) << conf;
  }
}

// to_json() writes one key per row, each the row's JSON key, in the table's order.
TEST(Options, ToJsonWritesEachRowUnderItsKey) {
  const std::string json = Options{}.to_json();
  size_t last = 0;
  for (const OptionRow& row : option_table()) {
    const std::string key = "\"" + std::string(row.json_key) + "\":";
    const size_t at = json.find(key);
    ASSERT_NE(at, std::string::npos) << json << " lacks " << key;
    EXPECT_EQ(json.find(key, at + 1), std::string::npos) << key << " twice in " << json;
    EXPECT_GE(at, last) << key << " out of the table's order";
    last = at;
  }
  EXPECT_EQ(std::count(json.begin(), json.end(), ':'), static_cast<long>(option_table().size())) << json;
}

TEST(Options, ToJsonNamesEveryField) {
  std::string json = Options::parse("max_split_size_mb:64,debug_checks:1").to_json();
  EXPECT_NE(json.find("\"max_split_size\":" + std::to_string(64 * kMiB)), std::string::npos);
  EXPECT_NE(json.find("\"debug_checks\":true"), std::string::npos);
  EXPECT_NE(Options{}.to_json().find("\"max_split_size\":-1"), std::string::npos);
  // The amem options keep the keys snapshots already carry (bytes, -1 = off).
  std::string amem = Options::parse("large_page_mb:10,page_reclaim_age:4,cross_stream_reuse:handover").to_json();
  EXPECT_NE(amem.find("\"large_page_size\":" + std::to_string(10 * kMiB)), std::string::npos) << amem;
  EXPECT_NE(amem.find("\"page_reclaim_age\":4"), std::string::npos) << amem;
  EXPECT_NE(amem.find("\"cross_stream_reuse\":\"handover\""), std::string::npos) << amem;
  EXPECT_NE(Options{}.to_json().find("\"page_reclaim_age\":-1"), std::string::npos);
  EXPECT_EQ(Options::parse("page_reclaim_min_mb:32").page_reclaim_min_size, 32 * kMiB);
  EXPECT_THROW(Options::parse("page_reclaim_min_mb:-1"), ConfigError);
}

TEST(Options, MapAheadCountsRequests) {
  EXPECT_EQ(Options{}.map_ahead, 0u);
  EXPECT_EQ(Options::parse("map_ahead:2").map_ahead, 2u);
  EXPECT_EQ(Options::parse("map_ahead:16").map_ahead, 16u);
  EXPECT_THROW(Options::parse("map_ahead:17"), ConfigError);
  EXPECT_THROW(Options::parse("map_ahead:-1"), ConfigError);
}

// ---------------------------------------------------------------- errors

TEST(OptionErrors, UnknownKey) {
  expect_rejected("no_such_option:1", "no_such_option");
  expect_rejected("max_split_size_mb:20,expandable_segment:True", "expandable_segment");
  EXPECT_NE(config_error("bogus:1").find("max_split_size_mb"), std::string::npos)
      << "the message should list the accepted keys";
}

TEST(OptionErrors, MissingColon) {
  expect_rejected("max_split_size_mb", "max_split_size_mb");
  expect_rejected("max_split_size_mb,debug_checks:True", "max_split_size_mb");
  expect_rejected("roundup_power2_divisions:[256 4]", "roundup_power2_divisions");
}

TEST(OptionErrors, MissingValue) {
  expect_rejected("max_split_size_mb:", "max_split_size_mb");
  expect_rejected("debug_checks:True,garbage_collection_threshold:", "garbage_collection_threshold");
  expect_rejected("max_non_split_rounding_mb:,debug_checks:1", "max_non_split_rounding_mb");
  expect_rejected("roundup_power2_divisions:[256:]", "roundup_power2_divisions");
  expect_rejected("roundup_power2_divisions:[256:4", "roundup_power2_divisions");
}

TEST(OptionErrors, NotANumber) {
  expect_rejected("max_split_size_mb:abc", "max_split_size_mb");
  expect_rejected("max_split_size_mb:-20", "max_split_size_mb");
  expect_rejected("max_split_size_mb:20.5", "max_split_size_mb");
  expect_rejected("max_non_split_rounding_mb:lots", "max_non_split_rounding_mb");
  expect_rejected("roundup_power2_divisions:four", "roundup_power2_divisions");
  expect_rejected("garbage_collection_threshold:half", "garbage_collection_threshold");
  expect_rejected("garbage_collection_threshold:0.5x", "garbage_collection_threshold");
  expect_rejected("garbage_collection_threshold:nan", "garbage_collection_threshold");
  expect_rejected("debug_checks:maybe", "debug_checks");
}

TEST(OptionErrors, MaxSplitSizeBelow20) {
  expect_rejected("max_split_size_mb:19", "max_split_size_mb");
  expect_rejected("max_split_size_mb:0", "max_split_size_mb");
  expect_rejected("max_non_split_rounding_mb:19", "max_non_split_rounding_mb");
}

TEST(OptionErrors, GarbageCollectionThresholdOutsideUnitInterval) {
  for (const char* v : {"1", "1.0", "-0.5", "1.5", "inf", "0.0000001e10"})
    expect_rejected(std::string("garbage_collection_threshold:") + v, "garbage_collection_threshold");
}

TEST(OptionErrors, DivisionsNotAPowerOfTwo) {
  expect_rejected("roundup_power2_divisions:3", "roundup_power2_divisions");
  expect_rejected("roundup_power2_divisions:[256:3]", "roundup_power2_divisions");
  expect_rejected("roundup_power2_divisions:[256:4,>:6]", "roundup_power2_divisions");
  expect_rejected("roundup_power2_divisions:[300:4]", "roundup_power2_divisions");  // interval
  expect_rejected("roundup_power2_divisions:[0:4]", "roundup_power2_divisions");
}

TEST(OptionErrors, TrailingGarbage) {
  expect_rejected("max_split_size_mb:20:30", "max_split_size_mb");
  expect_rejected("debug_checks:True]", "debug_checks");
  expect_rejected("roundup_power2_divisions:[256:4]x", "roundup_power2_divisions");
  expect_rejected("roundup_power2_divisions:4[", "roundup_power2_divisions");
  expect_rejected("max_split_size_mb:20MB", "max_split_size_mb");
}

TEST(OptionErrors, ConfigErrorIsAnInvalidArgument) {
  EXPECT_THROW(Options::parse("max_split_size_mb:1"), std::invalid_argument);
}

}  // namespace
}  // namespace amem
