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

void parse_fine_pages_mb(Options& o, Tokens& t, const std::string& key) {
  std::string text = t.next(key, "its value");
  size_t mib = parse_unsigned(key, text);
  if (mib % 2 != 0 || mib >= (size_t{1} << 30)) bad_value(key, text, doc_of(key));
  o.fine_pages_size = mib * kMiB;
}

void parse_map_ahead(Options& o, Tokens& t, const std::string& key) {
  std::string text = t.next(key, "its value");
  size_t requests = parse_unsigned(key, text);
  if (requests > kMaxMapAhead) bad_value(key, text, doc_of(key));
  o.map_ahead = requests;
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

void parse_page_reclaim_min_mb(Options& o, Tokens& t, const std::string& key) {
  std::string text = t.next(key, "its value");
  size_t mib = parse_unsigned(key, text);
  if (mib >= SIZE_MAX / kMiB) bad_value(key, text, doc_of(key));
  o.page_reclaim_min_size = mib * kMiB;
}

// ---------------------------------------------------------------- printing each option
// text_<name>: the value as AMEM_CONF writes it (parses back to the same value);
// json_<name>: the value under the row's JSON key (sizes in bytes, -1 = unlimited / off).

const char* cross_stream_name(CrossStream c) {
  return c == CrossStream::kWait ? "wait" : c == CrossStream::kHandover ? "handover" : "off";
}

std::string format_mib(size_t bytes) {
  return bytes == SIZE_MAX ? "unlimited" : std::to_string(bytes / kMiB);
}

std::string bool_text(bool v) { return v ? "True" : "False"; }
std::string bool_json(bool v) { return v ? "true" : "false"; }
std::string bytes_json(size_t bytes) { return bytes == SIZE_MAX ? "-1" : std::to_string(bytes); }

std::string format_divisions(const Divisions& d) {
  bool uniform = std::all_of(d.begin(), d.end(), [&](size_t v) { return v == d[0]; });
  if (uniform) return std::to_string(d[0]);
  std::string out = "[";
  for (size_t i = 0; i < d.size(); ++i)
    out += (i ? "," : "") + std::to_string(size_t{1} << i) + ":" + std::to_string(d[i]);
  return out + "]";
}

std::string divisions_json(const Divisions& d) {
  std::string out = "[";
  for (size_t i = 0; i < d.size(); ++i) out += (i ? "," : "") + std::to_string(d[i]);
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

std::string text_max_split_size_mb(const Options& o) { return format_mib(o.max_split_size); }
std::string json_max_split_size_mb(const Options& o) { return bytes_json(o.max_split_size); }
std::string text_max_non_split_rounding_mb(const Options& o) { return format_mib(o.max_non_split_rounding_size); }
std::string json_max_non_split_rounding_mb(const Options& o) { return std::to_string(o.max_non_split_rounding_size); }
std::string text_roundup_power2_divisions(const Options& o) { return format_divisions(o.roundup_power2_divisions); }
std::string json_roundup_power2_divisions(const Options& o) { return divisions_json(o.roundup_power2_divisions); }
std::string text_garbage_collection_threshold(const Options& o) { return format_double(o.garbage_collection_threshold); }
std::string json_garbage_collection_threshold(const Options& o) { return format_double(o.garbage_collection_threshold); }
std::string text_expandable_segments(const Options& o) { return bool_text(o.expandable_segments); }
std::string json_expandable_segments(const Options& o) { return bool_json(o.expandable_segments); }
std::string text_debug_checks(const Options& o) { return bool_text(o.debug_checks); }
std::string json_debug_checks(const Options& o) { return bool_json(o.debug_checks); }
std::string text_cross_stream_reuse(const Options& o) { return cross_stream_name(o.cross_stream_reuse); }
std::string json_cross_stream_reuse(const Options& o) { return std::string("\"") + cross_stream_name(o.cross_stream_reuse) + "\""; }
std::string text_large_page_mb(const Options& o) { return std::to_string(o.large_page_size / kMiB); }
std::string json_large_page_mb(const Options& o) { return std::to_string(o.large_page_size); }
std::string text_small_pool(const Options& o) { return bool_text(o.small_pool); }
std::string json_small_pool(const Options& o) { return bool_json(o.small_pool); }
std::string text_page_reclaim_age(const Options& o) {
  return o.page_reclaim_age < 0 ? "off" : std::to_string(o.page_reclaim_age);
}
std::string json_page_reclaim_age(const Options& o) { return std::to_string(o.page_reclaim_age); }
std::string text_fine_pages_mb(const Options& o) { return std::to_string(o.fine_pages_size / kMiB); }
std::string json_fine_pages_mb(const Options& o) { return std::to_string(o.fine_pages_size); }
std::string text_map_ahead(const Options& o) { return std::to_string(o.map_ahead); }
std::string json_map_ahead(const Options& o) { return std::to_string(o.map_ahead); }
std::string text_page_reclaim_min_mb(const Options& o) { return std::to_string(o.page_reclaim_min_size / kMiB); }
std::string json_page_reclaim_min_mb(const Options& o) { return std::to_string(o.page_reclaim_min_size); }

using ParseFn = void (*)(Options&, Tokens&, const std::string&);

ParseFn parser_for(const std::string& key) {
#define AMEM_DISPATCH(name, type, field, initial, json, text, doc) \
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

}  // namespace

// ---------------------------------------------------------------- public

const std::vector<OptionRow>& option_table() {
  static const std::vector<OptionRow> rows = {
#define AMEM_ROW(name, type, field, initial, json, text, doc) OptionRow{#name, json, text, doc},
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
  std::string out;
#define AMEM_TEXT(name, type, field, initial, json, text, doc) \
  out += (out.empty() ? "" : ",") + std::string(#name ":") + text_##name(*this);
  AMEM_OPTION_TABLE(AMEM_TEXT)
#undef AMEM_TEXT
  return out;
}

std::string Options::to_json() const {
  std::string out;
#define AMEM_JSON(name, type, field, initial, json, text, doc) \
  out += (out.empty() ? "{\"" : ",\"") + std::string(json "\":") + json_##name(*this);
  AMEM_OPTION_TABLE(AMEM_JSON)
#undef AMEM_JSON
  return out + "}";
}

}  // namespace amem
