// test_support.h — helpers shared by the C++ tests: a minimal JSON reader for
// stats_json()/segments_json(), typed views of segments and blocks, and
// allocator factories. Header-only; not a test file itself.
#pragma once

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/simulated_streams.h"
#include "bind/torch_devices.h"
#include "core/caching_allocator.h"

namespace amem::test {

// ================================================================ minimal JSON

// Enough JSON for the allocator's exports: objects, arrays, strings without
// escapes, integers and decimals, true/false/null.
struct Json {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  std::string text;  // number text, string value, or "true"/"false"
  std::vector<Json> items;
  std::map<std::string, Json> fields;

  const Json& operator[](const std::string& key) const {
    auto it = fields.find(key);
    if (it == fields.end()) throw std::out_of_range("json: no key " + key);
    return it->second;
  }
  int64_t as_int() const { return std::strtoll(text.c_str(), nullptr, 10); }
  uint64_t as_uint() const { return std::strtoull(text.c_str(), nullptr, 10); }
  double as_double() const { return std::strtod(text.c_str(), nullptr); }
  bool operator==(const Json& o) const {
    return kind == o.kind && text == o.text && items == o.items && fields == o.fields;
  }
};

class JsonReader {
 public:
  explicit JsonReader(const std::string& s) : s_(s) {}

  Json parse() {
    Json v = value();
    skip_space();
    if (pos_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const char* what) {
    throw std::runtime_error(std::string("json: ") + what + " at " + std::to_string(pos_));
  }
  void skip_space() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  void expect(char c) {
    skip_space();
    if (pos_ >= s_.size() || s_[pos_] != c) fail("unexpected character");
    ++pos_;
  }
  bool take(char c) {
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == c) return ++pos_, true;
    return false;
  }
  std::string string_value() {
    expect('"');
    size_t end = s_.find('"', pos_);
    if (end == std::string::npos) fail("unterminated string");
    std::string out = s_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return out;
  }
  Json value() {
    skip_space();
    Json v;
    if (pos_ >= s_.size()) fail("unexpected end");
    char c = s_[pos_];
    if (c == '{') {
      v.kind = Json::kObject;
      ++pos_;
      if (take('}')) return v;
      do {
        std::string key = string_value();
        expect(':');
        v.fields[key] = value();
      } while (take(','));
      expect('}');
    } else if (c == '[') {
      v.kind = Json::kArray;
      ++pos_;
      if (take(']')) return v;
      do v.items.push_back(value());
      while (take(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Json::kString;
      v.text = string_value();
    } else {
      size_t start = pos_;
      while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) ||
                                  s_[pos_] == '-' || s_[pos_] == '.' || s_[pos_] == '+'))
        ++pos_;
      v.text = s_.substr(start, pos_ - start);
      if (v.text.empty()) fail("bad value");
      v.kind = v.text == "null" ? Json::kNull
               : (v.text == "true" || v.text == "false") ? Json::kBool
                                                          : Json::kNumber;
    }
    return v;
  }

  const std::string& s_;
  size_t pos_ = 0;
};

inline Json parse_json(const std::string& s) { return JsonReader(s).parse(); }

// ================================================================ allocator views

struct BlockView {
  uintptr_t address = 0;
  size_t size = 0;
  size_t requested = 0;
  std::string state;  // active_allocated, active_pending_free, inactive
};

struct SegmentView {
  uintptr_t address = 0;
  size_t total_size = 0;
  StreamId stream = 0;
  std::string type;  // "small" or "large"
  std::vector<BlockView> blocks;
};

inline std::vector<SegmentView> segments(const CachingAllocator& a) {
  std::vector<SegmentView> out;
  for (const Json& s : parse_json(a.segments_json()).items) {
    SegmentView seg{s["address"].as_uint(), s["total_size"].as_uint(), s["stream"].as_uint(),
                    s["segment_type"].text, {}};
    for (const Json& b : s["blocks"].items)
      seg.blocks.push_back({b["address"].as_uint(), b["size"].as_uint(),
                            b["requested_size"].as_uint(), b["state"].text});
    out.push_back(seg);
  }
  return out;
}

// The segment containing `address`; nullptr-like empty view (total_size 0) if none.
inline SegmentView segment_of(const CachingAllocator& a, uintptr_t address) {
  for (const SegmentView& s : segments(a))
    if (address >= s.address && address < s.address + s.total_size) return s;
  return {};
}

// The block starting at `address`; state "" if none.
inline BlockView block_at(const CachingAllocator& a, uintptr_t address) {
  for (const BlockView& b : segment_of(a, address).blocks)
    if (b.address == address) return b;
  return {};
}

// One value of stats_json(), e.g. stat(a, "reserved_bytes.all.current").
inline int64_t stat(const CachingAllocator& a, const std::string& key) {
  return parse_json(a.stats_json())[key].as_int();
}

// stats_json() without the given counter, to compare everything else.
inline std::map<std::string, Json> stats_without(const CachingAllocator& a,
                                                 const std::string& skip) {
  auto fields = parse_json(a.stats_json()).fields;
  fields.erase(skip);
  return fields;
}

// ================================================================ factories

inline std::unique_ptr<CachingAllocator> make_sim(size_t limit = 0, const std::string& conf = "") {
  return std::make_unique<CachingAllocator>(make_sim_backend(limit), Options::parse(conf));
}

inline std::unique_ptr<CachingAllocator> make_host(size_t limit, const std::string& conf = "") {
  return std::make_unique<CachingAllocator>(make_host_backend(limit), Options::parse(conf));
}

// On the cuda backend: in the C++ tests, the fake CUDA (tests/cpp/fake_cuda), with
// torch's device switching (the fake libc10_cuda.so) handed down as the registry does.
inline std::unique_ptr<CachingAllocator> make_cuda(int device, const std::string& conf = "") {
  return std::make_unique<CachingAllocator>(make_cuda_backend(device, torch_device_switch()), Options::parse(conf));
}

inline SimulatedBackend& streams_of(CachingAllocator& a) {
  return *dynamic_cast<SimulatedBackend*>(&a.backend());
}

// malloc and free, each followed by the invariant walker.
inline uintptr_t alloc(CachingAllocator& a, size_t size, StreamId stream = 0) {
  uintptr_t p = a.malloc(size, stream);
  a.check_valid();
  return p;
}

inline void release(CachingAllocator& a, uintptr_t p) {
  a.free(p);
  a.check_valid();
}

}  // namespace amem::test
