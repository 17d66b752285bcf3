// options.cpp — parsing and printing the option table (see options.h).
//
// The lexer splits on `,` `:` `[` `]` exactly as torch's AllocatorConfig::lexArgs
// does, so any PYTORCH_CUDA_ALLOC_CONF string that sets the options we share
// parses here the same way. Each option has one parse_<name> function.
#include "options.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace amem {
namespace {

// ---------------------------------------------------------------- tokens

struct Tokens {
  std::vector<std::string> items;
  size_t pos = 0;

  bool done() const { return pos >= items.size(); }
  const std::string& peek() const { return items[pos]; }
  std::string next(const std::string& key, const char* what) {
    if (done()) throw ConfigError("AMEM_CONF: option '" + key + "' is missing " + what);
    return items[pos++];
  }
  void expect(const std::string& key, const char* symbol) {
    std::string got = done() ? std::string("the end") : "'" + peek() + "'";
    if (done() || peek() != symbol)
      throw ConfigError("AMEM_CONF: expected '" + std::string(symbol) + "' after '" + key +
                        "', found " + got + " (syntax: key:value,key:value)");
    ++pos;
  }
};

Tokens lex(const std::string& conf) {
  Tokens t;
  std::string buf;
  for (char c : conf) {
    if (c == ',' || c == ':' || c == '[' || c == ']') {
      if (!buf.empty()) t.items.push_back(buf);
      buf.clear();
      t.items.emplace_back(1, c);
    } else if (c != ' ' && c != '\t' && c != '\n') {
      buf.push_back(c);
    }
  }
  if (!buf.empty()) t.items.push_back(buf);
  return t;
}

// ---------------------------------------------------------------- values

[[noreturn]] void bad_value(const std::string& key, const std::string& value, const char* accepted) {
  throw ConfigError("AMEM_CONF: bad value '" + value + "' for option '" + key +
                    "'; accepted: " + accepted);
}

const char* doc_of(const std::string& key) {
  for (const auto& row : option_table())
    if (key == row.name) return row.doc;
  return "";
}

size_t parse_unsigned(const std::string& key, const std::string& text) {
  size_t value = 0;
  auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (err != std::errc() || end != text.data() + text.size()) bad_value(key, text, doc_of(key));
  return value;
}

bool is_power_of_two(size_t v) { return v != 0 && (v & (v - 1)) == 0; }

size_t log2_floor(size_t v) { return 63 - static_cast<size_t>(__builtin_clzll(v)); }

size_t parse_mib_at_least_20(const std::string& key, const std::string& text) {
  size_t mib = parse_unsigned(key, text);
  if (mib < kLargeBuffer / kMiB) bad_value(key, text, doc_of(key));
  if (mib >= SIZE_MAX / kMiB) return SIZE_MAX;  // "as large as it gets" (torch clamps too)
  return mib * kMiB;
}

size_t parse_divisions(const std::string& key, const std::string& text) {
  size_t d = parse_unsigned(key, text);
  if (d != 0 && !is_power_of_two(d)) bad_value(key, text, doc_of(key));
  // More divisions than a 512-byte step can express change nothing, and a
  // count near 2^55 would overflow round_size's `512 * divisions`.
  if (d > kMaxRoundupDivisions)
    throw ConfigError("AMEM_CONF: bad value '" + text + "' for option '" + key + "'; at most " +
                      std::to_string(kMaxRoundupDivisions) + " divisions (a power of 2) are accepted");
  return d;
}

// ---------------------------------------------------------------- one function per option

void parse_max_split_size_mb(Options& o, Tokens& t, const std::string& key) {
  std::string text = t.next(key, "its value");
  o.max_split_size = text == "unlimited" ? SIZE_MAX : parse_mib_at_least_20(key, text);
}

void parse_max_non_split_rounding_mb(Options& o, Tokens& t, const std::string& key) {
  o.max_non_split_rounding_size = parse_mib_at_least_20(key, t.next(key, "its value"));
}

// `[256:1,512:2,>:8]`: interval start in MiB (a power of 2) : divisions. The
// first entry also covers every interval below it; `>` covers all above the last.
void parse_division_list(Options& o, Tokens& t, const std::string& key) {
  auto& table = o.roundup_power2_divisions;
  bool first = true;
  size_t last_index = 0;
  while (!t.done() && t.peek() != "]") {
    std::string start = t.next(key, "an interval");
    t.expect(key, ":");
    size_t divisions = parse_divisions(key, t.next(key, "a division count"));
    if (start == ">") {
      for (size_t i = last_index + 1; i < table.size(); ++i) table[i] = divisions;  // torch
    } else {
      size_t mib = parse_unsigned(key, start);
      if (!is_power_of_two(mib)) bad_value(key, start, "interval starts that are powers of 2 (MiB)");
      size_t index = std::min(log2_floor(mib), table.size() - 1);
      if (first)
        for (size_t i = 0; i < index; ++i) table[i] = divisions;
      table[index] = divisions;
      last_index = index;
      first = false;
    }
    if (!t.done() && t.peek() == ",") t.pos++;
  }
  t.expect(key, "]");
}

void parse_roundup_power2_divisions(Options& o, Tokens& t, const std::string& key) {
  if (!t.done() && t.peek() == "[") {
    t.pos++;
    parse_division_list(o, t, key);
    return;
  }
  o.roundup_power2_divisions.fill(parse_divisions(key, t.next(key, "its value")));
}

void parse_garbage_collection_threshold(Options& o, Tokens& t, const std::string& key) {
  std::string text = t.next(key, "its value");
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  // 0 is the table's default (off), accepted so that to_string() parses back.
  if (end != text.c_str() + text.size() || !(v == 0.0 || (v > 0.0 && v < 1.0)))
    bad_value(key, text, doc_of(key));
  o.garbage_collection_threshold = v;
}

bool parse_bool(Tokens& t, const std::string& key) {
  std::string text = t.next(key, "its value");
  if (text == "True" || text == "true" || text == "1") return true;
  if (text == "False" || text == "false" || text == "0") return false;
  bad_value(key, text, "True or False");
}

void parse_expandable_segments(Options& o, Tokens& t, const std::string& key) {
  o.expandable_segments = parse_bool(t, key);
}

void parse_debug_checks(Options& o, Tokens& t, const std::string& key) {
  o.debug_checks = parse_bool(t, key);
}

void parse_cross_stream_reuse(Options& o, Tokens& t, const std::string& key) {
  std::string text = t.next(key, "its value");
  if (text == "off") o.cross_stream_reuse = CrossStream::kOff;
  else if (text == "wait") o.cross_stream_reuse = CrossStream::kWait;
  else if (text == "handover") o.cross_stream_reuse = CrossStream::kHandover;
  else bad_value(key, text, "off, wait or handover");
}

void parse_large_page_mb(Options& o, Tokens& t, const std::string& key) {
  std::string text = t.next(key, "its value");
  size_t mib = parse_unsigned(key, text);
  if (mib < 2 || mib > kLargeBuffer / kMiB || mib % 2 != 0) bad_value(key, text, doc_of(key));
  o.large_page_size = mib * kMiB;
}

void parse_small_pool(Options& o, Tokens& t, const std::string& key) { o.small_pool = parse_bool(t, key); }

void parse_page_reclaim_age(Options& o, Tokens& t, const std::string& key) {
  std::string text = t.next(key, "its value");
  if (text == "off") {
    o.page_reclaim_age = -1;
    return;
  }
  size_t calls = parse_unsigned(key, text);
  if (calls > (size_t{1} << 62)) bad_value(key, text, doc_of(key));
  o.page_reclaim_age = static_cast<int64_t>(calls);
}

const char* cross_stream_name(CrossStream c) {
  return c == CrossStream::kWait ? "wait" : c == CrossStream::kHandover ? "handover" : "off";
}

std::string format_age(int64_t age) { return age < 0 ? "off" : std::to_string(age); }

using ParseFn = void (*)(Options&, Tokens&, const std::string&);

ParseFn parser_for(const std::string& key) {
#define AMEM_DISPATCH(name, def, doc) \
  if (key == #name) return &parse_##name;
  AMEM_OPTION_TABLE(AMEM_DISPATCH)
#undef AMEM_DISPATCH
  return nullptr;
}

std::string accepted_keys() {
  std::string keys;
  for (const auto& row : option_table()) keys += (keys.empty() ? "" : ", ") + std::string(row.name);
  return keys;
}

std::string format_mib(size_t bytes) {
  return bytes == SIZE_MAX ? "unlimited" : std::to_string(bytes / kMiB);
}

std::string format_divisions(const Options& o) {
  const auto& d = o.roundup_power2_divisions;
  bool uniform = std::all_of(d.begin(), d.end(), [&](size_t v) { return v == d[0]; });
  if (uniform) return std::to_string(d[0]);
  std::string out = "[";
  for (size_t i = 0; i < d.size(); ++i)
    out += (i ? "," : "") + std::to_string(size_t{1} << i) + ":" + std::to_string(d[i]);
  return out + "]";
}

// printf's %g, as std::ostream would print it, without iostreams: an extension built with
// GCC 13 crashed in ostream<<double once torch 2.11 was loaded (H100, 2026-11-23), so no
// file of the extension uses iostreams (tests/test_enable.py checks the built module).
std::string format_double(double v) {
  char text[32];
  int n = std::snprintf(text, sizeof text, "%g", v);
  return std::string(text, n > 0 ? static_cast<size_t>(n) : 0);
}

}  // namespace

// ---------------------------------------------------------------- public

const std::vector<OptionRow>& option_table() {
  static const std::vector<OptionRow> rows = {
#define AMEM_ROW(name, def, doc) OptionRow{#name, def, doc},
      AMEM_OPTION_TABLE(AMEM_ROW)
#undef AMEM_ROW
  };
  return rows;
}

Options Options::parse(const std::string& conf) {
  Options o;
  Tokens t = lex(conf);
  while (!t.done()) {
    std::string key = t.next("", "a key");
    ParseFn parse = parser_for(key);
    if (parse == nullptr)
      throw ConfigError("AMEM_CONF: unknown option '" + key + "'; accepted options: " + accepted_keys());
    t.expect(key, ":");
    parse(o, t, key);
    if (!t.done()) t.expect(key, ",");
  }
  return o;
}

std::string Options::to_string() const {
  return "max_split_size_mb:" + format_mib(max_split_size) +
         ",max_non_split_rounding_mb:" + format_mib(max_non_split_rounding_size) +
         ",roundup_power2_divisions:" + format_divisions(*this) +
         ",garbage_collection_threshold:" + format_double(garbage_collection_threshold) +
         ",expandable_segments:" + (expandable_segments ? "True" : "False") +
         ",debug_checks:" + (debug_checks ? "True" : "False") +
         ",cross_stream_reuse:" + cross_stream_name(cross_stream_reuse) +
         ",large_page_mb:" + std::to_string(large_page_size / kMiB) +
         ",small_pool:" + (small_pool ? "True" : "False") +
         ",page_reclaim_age:" + format_age(page_reclaim_age);
}

std::string Options::to_json() const {
  std::string divisions = "[";
  for (size_t i = 0; i < roundup_power2_divisions.size(); ++i)
    divisions += (i ? "," : "") + std::to_string(roundup_power2_divisions[i]);
  divisions += "]";
  return std::string("{") + "\"max_split_size\":" +
         (max_split_size == SIZE_MAX ? "-1" : std::to_string(max_split_size)) +
         ",\"max_non_split_rounding_size\":" + std::to_string(max_non_split_rounding_size) +
         ",\"roundup_power2_divisions\":" + divisions +
         ",\"garbage_collection_threshold\":" + format_double(garbage_collection_threshold) +
         ",\"expandable_segments\":" + (expandable_segments ? "true" : "false") +
         ",\"debug_checks\":" + (debug_checks ? "true" : "false") +
         ",\"cross_stream_reuse\":\"" + cross_stream_name(cross_stream_reuse) + "\"" +
         ",\"large_page_size\":" + std::to_string(large_page_size) +
         ",\"small_pool\":" + (small_pool ? "true" : "false") +
         ",\"page_reclaim_age\":" + std::to_string(page_reclaim_age) + "}";
}

}  // namespace amem
