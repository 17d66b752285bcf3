// stats.cpp — resets and the JSON export, generated from the lists in stats.h.
#include "stats.h"

namespace amem {
namespace {

const char* const kPoolNames[3] = {"all", "small_pool", "large_pool"};

void append(std::string& out, const std::string& key, int64_t value) {
  out += (out.size() > 1 ? ",\"" : "\"") + key + "\":" + std::to_string(value);
}

void append_stat(std::string& out, const std::string& prefix, const Stat& s) {
  append(out, prefix + ".current", s.current);
  append(out, prefix + ".peak", s.peak);
  append(out, prefix + ".allocated", s.allocated);
  append(out, prefix + ".freed", s.freed());
}

}  // namespace

void Stats::reset_peaks() {
#define AMEM_RESET_POOL(name, doc) name.reset_peak();
  AMEM_POOL_STATS(AMEM_RESET_POOL)
#undef AMEM_RESET_POOL
#define AMEM_RESET_SINGLE(name, doc) name.reset_peak();
  AMEM_SINGLE_STATS(AMEM_RESET_SINGLE)
#undef AMEM_RESET_SINGLE
  allocated_at_reserved_peak = allocated_bytes.current();
}

void Stats::reset_accumulated() {
#define AMEM_RESET_POOL(name, doc) name.reset_accumulated();
  AMEM_POOL_STATS(AMEM_RESET_POOL)
#undef AMEM_RESET_POOL
#define AMEM_RESET_SINGLE(name, doc) name.reset_accumulated();
  AMEM_SINGLE_STATS(AMEM_RESET_SINGLE)
#undef AMEM_RESET_SINGLE
#define AMEM_RESET_COUNTER(name, doc) name = 0;
  AMEM_COUNTERS(AMEM_RESET_COUNTER)
#undef AMEM_RESET_COUNTER
}

std::string Stats::to_json(size_t max_split_size) const {
  std::string out = "{";
#define AMEM_EXPORT_POOL(name, doc) \
  for (int p = 0; p < 3; ++p) append_stat(out, std::string(#name ".") + kPoolNames[p], name.by_pool(p));
  AMEM_POOL_STATS(AMEM_EXPORT_POOL)
#undef AMEM_EXPORT_POOL
#define AMEM_EXPORT_SINGLE(name, doc) append_stat(out, #name, name);
  AMEM_SINGLE_STATS(AMEM_EXPORT_SINGLE)
#undef AMEM_EXPORT_SINGLE
#define AMEM_EXPORT_COUNTER(name, doc) append(out, #name, name);
  AMEM_COUNTERS(AMEM_EXPORT_COUNTER)
#undef AMEM_EXPORT_COUNTER
  append(out, "max_split_size", max_split_size == SIZE_MAX ? -1 : static_cast<int64_t>(max_split_size));
  append(out, "allocated_bytes_at_reserved_peak", allocated_at_reserved_peak);
  return out + "}";
}

}  // namespace amem
