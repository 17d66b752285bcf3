// trace.cpp — the event ring (see trace.h).
#include "trace.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>

namespace amem {
namespace {

std::atomic<uint32_t> g_next_thread{0};

int64_t now_us() {
  using namespace std::chrono;
  return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count();
}

uint64_t read_ticks() { return read_trace_ticks(); }

// The (ticks, wall clock) anchor taken when the first recording started, and
// the tick rate, measured once at the first export and then fixed so that
// every export of the same events gives the same times.
struct TimeAnchor {
  std::once_flag once;
  uint64_t ticks = 0;
  int64_t us = 0;
  std::once_flag rate_once;
  double ticks_per_us = 1.0;
};
TimeAnchor g_anchor;

void take_anchor() {
  std::call_once(g_anchor.once, [] {
    g_anchor.us = now_us();
    g_anchor.ticks = read_ticks();
  });
}

// Ticks per microsecond over the span since the anchor, at least 20 ms
// (a relative error under 1e-4); measured once.
double ticks_per_us() {
  take_anchor();
  std::call_once(g_anchor.rate_once, [] {
    int64_t us = now_us();
    while (us - g_anchor.us < 20000) us = now_us();  // only a first export right after start waits
    uint64_t ticks = read_ticks();
    g_anchor.ticks_per_us = static_cast<double>(ticks - g_anchor.ticks) / static_cast<double>(us - g_anchor.us);
  });
  return g_anchor.ticks_per_us;
}

void append_event(std::string& out, const TraceEvent& e, uint64_t seq, double rate) {
  const int64_t time_us =
      g_anchor.us + static_cast<int64_t>(static_cast<double>(static_cast<int64_t>(e.ticks - g_anchor.ticks)) / rate);
  out += "{\"seq\":" + std::to_string(seq) + ",\"action\":\"" + trace_action_name(e.action) +
         "\",\"addr\":" + std::to_string(e.address) + ",\"size\":" + std::to_string(e.size) +
         ",\"rounded_size\":" + std::to_string(e.rounded) + ",\"stream\":" + std::to_string(e.stream) +
         ",\"time_us\":" + std::to_string(time_us) + ",\"thread\":" + std::to_string(e.thread) +
         ",\"tag\":" + std::to_string(e.tag) + ",\"context\":" + std::to_string(e.context) +
         ",\"alloc_seq\":" + std::to_string(e.alloc_seq) + "}";
}

}  // namespace

namespace trace_detail {
std::atomic<uint32_t> tag{0};
thread_local uint32_t context = 0;
thread_local uint32_t thread_number = 0;
uint32_t new_thread_number() { return thread_number = ++g_next_thread; }  // never reused
}  // namespace trace_detail

const char* trace_action_name(TraceAction action) {
  switch (action) {
#define AMEM_ACTION_NAME(name) \
  case TraceAction::k_##name:  \
    return #name;
    AMEM_TRACE_ACTIONS(AMEM_ACTION_NAME)
#undef AMEM_ACTION_NAME
  }
  return "unknown";
}

void set_trace_tag(uint32_t tag) { trace_detail::tag.store(tag, std::memory_order_relaxed); }
void set_thread_trace_context(uint32_t context) { trace_detail::context = context; }


void Trace::start(size_t max_entries) {
  if (max_entries == 0) throw std::invalid_argument("amem: max_entries must be at least 1");
  take_anchor();
  if (max_entries != ring_.size()) {
    std::vector<TraceEvent> kept = events();
    size_t skip = kept.size() > max_entries ? kept.size() - max_entries : 0;
    dropped_ += skip;
    ring_.assign(max_entries, TraceEvent{});
    count_ = 0;
    head_ = 0;
    for (size_t i = skip; i < kept.size(); ++i) ring_[count_++] = kept[i];
    head_ = count_ % max_entries;
  }
  on_ = true;
}

void Trace::clear() {
  head_ = count_ = 0;
  dropped_ = 0;
  next_seq_ = 0;
}

std::vector<TraceEvent> Trace::events() const {
  std::vector<TraceEvent> out;
  out.reserve(count_);
  size_t start = count_ == ring_.size() ? head_ : 0;
  for (size_t i = 0; i < count_; ++i) out.push_back(ring_[(start + i) % ring_.size()]);
  return out;
}

std::string Trace::to_json() const {
  std::string out = "{\"recording\":" + std::string(on_ ? "true" : "false") +
                    ",\"max_entries\":" + std::to_string(ring_.size()) +
                    ",\"recorded\":" + std::to_string(next_seq_) +
                    ",\"dropped\":" + std::to_string(dropped_) + ",\"events\":[";
  const double rate = ticks_per_us();
  uint64_t seq = first_seq();
  for (const TraceEvent& e : events()) {
    if (seq != first_seq()) out += ",";
    append_event(out, e, seq++, rate);
  }
  return out + "]}";
}

}  // namespace amem
