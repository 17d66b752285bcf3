// options.h — the one table of allocator options, and the parser for AMEM_CONF.
//
// Design note
// -----------
// Every tunable lives in AMEM_OPTION_TABLE below: one row per option with its
// name, its default (as the user would write it) and a comment giving the unit
// and meaning, plus the struct field it sets and its JSON key. The Options
// struct, the parser's dispatch, the printed configuration, the JSON export and
// the Python documentation are all generated from that table (each row names
// its own parse_/text_/json_ functions in options.cpp), so an option cannot be
// added in one place and forgotten in another.
//
// The syntax is PYTORCH_CUDA_ALLOC_CONF's: `key:value,key:value`, with
// roundup_power2_divisions also accepting `[256:1,512:2,>:8]` (interval start
// in MiB : divisions). torch's options keep torch's meaning exactly. A bad key
// or value throws ConfigError (std::invalid_argument; Python sees ValueError)
// naming the key and what is accepted — a bad value never passes silently.
#pragma once

#include <array>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "constants.h"

namespace amem {

// X(name, C++ type, field, initial value, JSON key, default as written, accepted values and meaning)
//
// The field and its initial value are the struct's (Options below); the JSON key is what
// to_json() writes, kept as it was (torch's allocator_settings names, sizes in bytes) so
// snapshots and the Python side read the same keys; the default as written is what
// to_string() prints for the initial value, which tests/cpp/options_test.cpp checks.
#define AMEM_OPTION_TABLE(X)                                                             \
  X(max_split_size_mb, size_t, max_split_size, SIZE_MAX, "max_split_size", "unlimited",   \
    "integer MiB >= 20: cached blocks this large or larger are never split, and serve "  \
    "only requests of at least this size (torch)")                                       \
  X(max_non_split_rounding_mb, size_t, max_non_split_rounding_size, kLargeBuffer,        \
    "max_non_split_rounding_size", "20",                                                 \
    "integer MiB >= 20: a request of at least max_split_size may take a cached block "   \
    "at most this much larger than itself (torch)")                                      \
  X(roundup_power2_divisions, Divisions, roundup_power2_divisions, Divisions{},          \
    "roundup_power2_divisions", "0",                                                     \
    "power of 2 up to 2^32, or a list [MiB:divisions,...,>:divisions]: round a request "  \
    "up to the next 1/N step of its power-of-two interval; 0 rounds to 512 B only (torch)") \
  X(garbage_collection_threshold, double, garbage_collection_threshold, 0.0,             \
    "garbage_collection_threshold", "0",                                                 \
    "fraction in (0, 1), or 0 (off): once a memory fraction is set and reserved "        \
    "memory passes this share of it, free the oldest cached blocks before asking the "   \
    "device (torch)")                                                                    \
  X(expandable_segments, bool, expandable_segments, false, "expandable_segments", "False", \
    "True/False: one segment per stream and pool that grows by mapping 2 MiB (small) or " \
    "20 MiB (large) pages, instead of many fixed segments (torch); on a GPU through "   \
    "the driver's virtual memory API")                                                   \
  X(debug_checks, bool, debug_checks, false, "debug_checks", "False",                    \
    "True/False: run the is_valid() walker over every segment after every operation "    \
    "(slow; for tests and bug hunts) (amem)")                                            \
  X(cross_stream_reuse, CrossStream, cross_stream_reuse, CrossStream::kOff,              \
    "cross_stream_reuse", "off",                                                         \
    "off/wait/handover: a free block last used on another stream may serve a request: "  \
    "wait = once an event recorded when it was freed has completed (one event per free), " \
    "handover = at once, the requesting stream made to wait on that stream's work "      \
    "(cudaStreamWaitEvent, no host sync; one event per handover) (amem)")               \
  X(large_page_mb, size_t, large_page_size, kLargeBuffer, "large_page_size", "20",       \
    "integer MiB, even, 2 to 20: the page by which expandable segments of the large pool " \
    "grow and shrink; torch maps 20 MiB (amem)")                                         \
  X(fine_pages_mb, size_t, fine_pages_size, 0, "fine_pages_size", "0",                   \
    "integer MiB, even: the first this many MiB of each large-pool expandable segment "  \
    "map and unmap in 2 MiB pages, the rest in large_page_mb pages, so a segment grows " \
    "finely while it is small and by large pages once it is large (amem)")              \
  X(map_ahead, size_t, map_ahead, 0, "map_ahead", "0",                                   \
    "integer requests, 0 (off) to 16: in the fine part (fine_pages_mb) of a large-pool "  \
    "expandable segment, a request under 10 MiB that grows the mapped end by the same "  \
    "size as the growth before it maps room for this many more such requests at once "   \
    "(at most one large_page_mb page, within the fine part): steady growth by equal "    \
    "tensors maps once per few (amem)")                                                  \
  X(small_pool, bool, small_pool, true, "small_pool", "True",                            \
    "True/False: False serves requests of 1 MiB and less from the large pool too, so "   \
    "expandable segments give them the large pool's page granularity instead of a "     \
    "separate 2 MiB-page pool per stream (amem)")                                        \
  X(page_reclaim_age, int64_t, page_reclaim_age, -1, "page_reclaim_age", "off",          \
    "integer allocator calls, or off (-1 in JSON): before an expandable segment maps "   \
    "pages that would raise reserved memory above its peak, unmap whole free pages idle " \
    "for at least this many calls, at most as many bytes as it maps and one unmap per "  \
    "four maps (one device sync per reclaim) (amem)")                                   \
  X(page_reclaim_min_mb, size_t, page_reclaim_min_size, 0, "page_reclaim_min_size", "0",   \
    "integer MiB: page reclaim (page_reclaim_age) runs only before mapping for a request " \
    "of at least this size: a large request that no hole fits, where unmapping the "     \
    "holes saves the most per device sync; smaller requests map as without reclaim (amem)")

struct OptionRow {
  const char* name;
  const char* json_key;
  const char* default_text;
  const char* doc;
};

// Thrown for any bad configuration; the message names the key and what it accepts.
class ConfigError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// cross_stream_reuse (Note [cross-stream reuse] in stream_fences.h; cross_stream_reuse.h).
enum class CrossStream { kOff, kWait, kHandover };

// roundup_power2_divisions: divisions per power-of-two interval (0 = off).
using Divisions = std::array<size_t, kRoundUpPowerOfTwoIntervals>;

// One field per row of the table, with the row's initial value (sizes in bytes;
// SIZE_MAX = unlimited; -1 = off).
struct Options {
#define AMEM_OPTION_FIELD(name, type, field, initial, json, text, doc) type field = initial;
  AMEM_OPTION_TABLE(AMEM_OPTION_FIELD)
#undef AMEM_OPTION_FIELD

  // Parses `key:value,...`; an empty string gives the defaults.
  static Options parse(const std::string& conf);
  // The divisions that apply to a request of `size` bytes (0 = off). Inline:
  // every malloc asks.
  size_t divisions_for(size_t size) const {
    constexpr long kStart = 63 - __builtin_clzll(kRoundUpPowerOfTwoStart);
    long index = static_cast<long>(63 - __builtin_clzll(size)) - kStart;
    index = index < 0 ? 0 : index >= static_cast<long>(kRoundUpPowerOfTwoIntervals)
                                ? static_cast<long>(kRoundUpPowerOfTwoIntervals) - 1 : index;
    return roundup_power2_divisions[static_cast<size_t>(index)];
  }
  // Canonical `key:value,...` text of every option, defaults included.
  std::string to_string() const;
  // {"<JSON key of each row>": value, ...} for snapshots and the Python side.
  std::string to_json() const;
};

const std::vector<OptionRow>& option_table();

}  // namespace amem
