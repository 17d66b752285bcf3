// trace_test.cpp — the event ring: positions after wrapping and resizing, and
// one timestamp per allocator call (Note [trace time] in core/trace.h).
#include <gtest/gtest.h>

#include "core/trace.h"
#include "test_support.h"

namespace amem {
namespace {

using test::make_sim;
using test::parse_json;

std::vector<uint64_t> seqs(const test::Json& trace) {
  std::vector<uint64_t> out;
  for (const auto& e : trace["events"].items) out.push_back(e["seq"].as_uint());
  return out;
}

TEST(Trace, PositionsStayContiguousWhenTheRingWraps) {
  auto a = make_sim();
  a->start_trace(4);
  for (int i = 0; i < 3; ++i) a->free(a->malloc(1000, 0));  // segment_alloc, then 3 events per pair
  test::Json trace = parse_json(a->trace_json());
  EXPECT_EQ(trace["recorded"].as_uint(), 10u);
  EXPECT_EQ(trace["dropped"].as_uint(), 6u);
  EXPECT_EQ(seqs(trace), (std::vector<uint64_t>{6, 7, 8, 9}));
  EXPECT_EQ(trace["events"].items[3]["action"].text, "free_completed");

  a->start_trace(2);  // shrinking keeps the newest events and their positions
  trace = parse_json(a->trace_json());
  EXPECT_EQ(seqs(trace), (std::vector<uint64_t>{8, 9}));
  EXPECT_EQ(trace["dropped"].as_uint(), 8u);

  a->clear_trace();
  a->free(a->malloc(1000, 0));
  EXPECT_EQ(seqs(parse_json(a->trace_json())), (std::vector<uint64_t>{1, 2}));  // 0 was overwritten
}

TEST(Trace, EventsOfOneCallShareOneTimestamp) {
  Trace t;
  t.start(8);
  t.record(TraceAction::k_free_requested, 0x1000, 512, 512, 0, 1);
  t.record(TraceAction::k_free_completed, 0x1000, 512, 512, 0, 1);
  t.end_call();
  volatile uint64_t spin = 0;
  for (int i = 0; i < 10000; ++i) spin = spin + 1;  // let the clock move on
  t.record(TraceAction::k_alloc, 0x1000, 512, 512, 0, 2);
  t.end_call();
  std::vector<TraceEvent> events = t.events();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].ticks, events[1].ticks);
  EXPECT_GT(events[2].ticks, events[1].ticks);
}

TEST(Trace, TheAllocatorEndsEveryCallItRecordsIn) {
  auto a = make_sim();
  uintptr_t p = a->malloc(1000, 0);
  a->start_trace(16);
  a->free(p);                  // free_requested + free_completed: one call
  p = a->malloc(1000, 0);      // alloc: the next call reads the clock again
  a->free(p);
  test::Json trace = parse_json(a->trace_json());
  ASSERT_EQ(trace["events"].items.size(), 5u);
  const auto& e = trace["events"].items;
  EXPECT_EQ(e[0]["time_us"].as_int(), e[1]["time_us"].as_int());
  EXPECT_EQ(e[3]["time_us"].as_int(), e[4]["time_us"].as_int());
  EXPECT_LE(e[1]["time_us"].as_int(), e[2]["time_us"].as_int());
}

}  // namespace
}  // namespace amem
