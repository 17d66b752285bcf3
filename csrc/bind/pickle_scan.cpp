// pickle_scan.cpp — one pass over a pickle's opcodes (protocols 0 to 5); see pickle_scan.h.
//
// The stack is modelled by its height and the marks' heights only, exactly as CPython's C
// unpickler (Modules/_pickle.c) moves them, so a file this scan accepts is unpickled with no
// more memo, marks or stack than the scan counted.
#include "pickle_scan.h"

#include <cstring>
#include <vector>

namespace amem {
namespace {

// ============================================================================ the opcode table
enum class Arg : uint8_t { kNone, kU1, kU2, kU4, kSkip4, kSkip8, kLen1, kLen4, kLen8, kLine, kTwoLines, kBad };

// How an opcode moves the stack: push/pop a fixed count, or gather everything above the last mark.
enum class Effect : uint8_t {
  kPush,       // +1
  kNoChange,   // 0 (memo stores, PROTO, FRAME, TUPLE1, BINPERSID, READONLY_BUFFER)
  kPop1,       // -1 (APPEND, BUILD, REDUCE, NEWOBJ, STACK_GLOBAL, TUPLE2)
  kPop2,       // -2 (SETITEM, NEWOBJ_EX, TUPLE3)
  kPop,        // POP: one value, or the last mark when it sits at the top
  kMark,       // MARK
  kPopMark,    // POP_MARK: drop everything above the last mark, and the mark
  kIntoBelow,  // APPENDS, SETITEMS, ADDITEMS: the items above the mark go into the object below it
  kBuild,      // LIST, TUPLE, DICT, FROZENSET, OBJ, INST: the items above the mark become one value
  kMemoPut,    // PUT, BINPUT, LONG_BINPUT: store the top under an index from the argument
  kMemoize,    // MEMOIZE: store the top under the next index
  kMemoGet,    // GET, BINGET, LONG_BINGET: push a stored value
  kStop,
};

struct Opcode {
  Arg arg = Arg::kBad;
  Effect effect = Effect::kPush;
};

struct Table {
  Opcode op[256];
  void set(const char* codes, Arg arg, Effect effect) {
    for (const char* c = codes; *c; ++c) op[static_cast<uint8_t>(*c)] = {arg, effect};
  }
  void set(int code, Arg arg, Effect effect) { op[code] = {arg, effect}; }
  Table() {
    set("N)]}", Arg::kNone, Effect::kPush);                       // NONE, EMPTY_TUPLE/LIST/DICT
    set(0x88, Arg::kNone, Effect::kPush);                         // NEWTRUE
    set(0x89, Arg::kNone, Effect::kPush);                         // NEWFALSE
    set(0x8f, Arg::kNone, Effect::kPush);                         // EMPTY_SET
    set(0x97, Arg::kNone, Effect::kPush);                         // NEXT_BUFFER
    set("2", Arg::kNone, Effect::kPush);                          // DUP
    set("K", Arg::kU1, Effect::kPush);                            // BININT1
    set("M", Arg::kU2, Effect::kPush);                            // BININT2
    set("J", Arg::kSkip4, Effect::kPush);                         // BININT
    set("G", Arg::kSkip8, Effect::kPush);                         // BINFLOAT
    set("UC", Arg::kLen1, Effect::kPush);                         // SHORT_BINSTRING, SHORT_BINBYTES
    set(0x8c, Arg::kLen1, Effect::kPush);                         // SHORT_BINUNICODE
    set(0x8a, Arg::kLen1, Effect::kPush);                         // LONG1
    set("TBX", Arg::kLen4, Effect::kPush);                        // BINSTRING, BINBYTES, BINUNICODE
    set(0x8b, Arg::kLen4, Effect::kPush);                         // LONG4
    set(0x8d, Arg::kLen8, Effect::kPush);                         // BINUNICODE8
    set(0x8e, Arg::kLen8, Effect::kPush);                         // BINBYTES8
    set(0x96, Arg::kLen8, Effect::kPush);                         // BYTEARRAY8
    set("ILFSVP", Arg::kLine, Effect::kPush);                     // INT, LONG, FLOAT, STRING, UNICODE, PERSID
    set("c", Arg::kTwoLines, Effect::kPush);                      // GLOBAL
    set(0x82, Arg::kU1, Effect::kPush);                           // EXT1
    set(0x83, Arg::kU2, Effect::kPush);                           // EXT2
    set(0x84, Arg::kSkip4, Effect::kPush);                        // EXT4
    set(0x80, Arg::kU1, Effect::kNoChange);                       // PROTO
    set(0x95, Arg::kSkip8, Effect::kNoChange);                    // FRAME (its bytes are opcodes too)
    set(0x85, Arg::kNone, Effect::kNoChange);                     // TUPLE1
    set("Q", Arg::kNone, Effect::kNoChange);                      // BINPERSID
    set(0x98, Arg::kNone, Effect::kNoChange);                     // READONLY_BUFFER
    set("abR", Arg::kNone, Effect::kPop1);                        // APPEND, BUILD, REDUCE
    set(0x81, Arg::kNone, Effect::kPop1);                         // NEWOBJ
    set(0x93, Arg::kNone, Effect::kPop1);                         // STACK_GLOBAL
    set(0x86, Arg::kNone, Effect::kPop1);                         // TUPLE2
    set("s", Arg::kNone, Effect::kPop2);                          // SETITEM
    set(0x92, Arg::kNone, Effect::kPop2);                         // NEWOBJ_EX
    set(0x87, Arg::kNone, Effect::kPop2);                         // TUPLE3
    set("0", Arg::kNone, Effect::kPop);                           // POP
    set("(", Arg::kNone, Effect::kMark);                          // MARK
    set("1", Arg::kNone, Effect::kPopMark);                       // POP_MARK
    set("eu", Arg::kNone, Effect::kIntoBelow);                    // APPENDS, SETITEMS
    set(0x90, Arg::kNone, Effect::kIntoBelow);                    // ADDITEMS
    set("ltdo", Arg::kNone, Effect::kBuild);                      // LIST, TUPLE, DICT, OBJ
    set(0x91, Arg::kNone, Effect::kBuild);                        // FROZENSET
    set("i", Arg::kTwoLines, Effect::kBuild);                     // INST
    set("p", Arg::kLine, Effect::kMemoPut);                       // PUT
    set("q", Arg::kU1, Effect::kMemoPut);                         // BINPUT
    set("r", Arg::kU4, Effect::kMemoPut);                         // LONG_BINPUT
    set(0x94, Arg::kNone, Effect::kMemoize);                      // MEMOIZE
    set("g", Arg::kLine, Effect::kMemoGet);                       // GET
    set("h", Arg::kU1, Effect::kMemoGet);                         // BINGET
    set("j", Arg::kU4, Effect::kMemoGet);                         // LONG_BINGET
    set(".", Arg::kNone, Effect::kStop);                          // STOP
  }
};

const Table& table() {
  static const Table t;
  return t;
}

// ============================================================================ the scanner
class Scanner {
 public:
  Scanner(const uint8_t* data, size_t size, const PickleLimits& limits)
      : data_(data), size_(size), limits_(limits) {}

  PickleScan run() {
    while (!done_) {
      if (!step()) break;
    }
    return out_;
  }

 private:
  // ---------------------------------------------------------------- outcomes
  bool malformed(const std::string& why) {  // the unpickler would reject it too: say where
    out_.problem = why;
    out_.offset = at_;
    return false;
  }
  bool refuse(const std::string& why) {
    out_.refused = true;
    return malformed(why);
  }
  bool truncated() { return malformed("truncated: the file ends inside an opcode"); }

  // ---------------------------------------------------------------- arguments
  bool read(size_t n, const uint8_t** p) {
    if (size_ - pos_ < n) return truncated();
    *p = data_ + pos_;
    pos_ += n;
    return true;
  }
  bool read_uint(size_t n, uint64_t* value) {
    const uint8_t* p = nullptr;
    if (!read(n, &p)) return false;
    *value = 0;
    for (size_t i = 0; i < n; ++i) *value |= static_cast<uint64_t>(p[i]) << (8 * i);
    return true;
  }
  bool skip_line(std::string* text) {
    const void* nl = std::memchr(data_ + pos_, '\n', size_ - pos_);
    if (nl == nullptr) return truncated();
    size_t end = static_cast<const uint8_t*>(nl) - data_;
    if (text != nullptr) text->assign(reinterpret_cast<const char*>(data_ + pos_), end - pos_);
    pos_ = end + 1;
    return true;
  }
  bool skip_counted(size_t width) {
    uint64_t n = 0;
    if (!read_uint(width, &n)) return false;
    if (width == 4 && (n & 0x80000000u) && (op_ == 'T' || op_ == 0x8b)) return malformed("a negative length");
    if (n > size_ - pos_) return truncated();
    pos_ += static_cast<size_t>(n);
    return true;
  }
  // The argument of the opcode at hand; `index` receives it for memo opcodes.
  bool argument(Arg arg, uint64_t* index) {
    switch (arg) {
      case Arg::kNone: return true;
      case Arg::kU1: return read_uint(1, index);
      case Arg::kU2: return read_uint(2, index);
      case Arg::kU4: return read_uint(4, index);
      case Arg::kSkip4: return read_uint(4, index);
      case Arg::kSkip8: return read_uint(8, index);
      case Arg::kLen1: return skip_counted(1);
      case Arg::kLen4: return skip_counted(4);
      case Arg::kLen8: return skip_counted(8);
      case Arg::kLine: return line_argument(index);
      case Arg::kTwoLines: return skip_line(nullptr) && skip_line(nullptr);
      case Arg::kBad: break;
    }
    return malformed("not a pickle opcode");
  }
  bool line_argument(uint64_t* index) {  // GET/PUT carry a decimal index; the others any text
    std::string text;
    if (!skip_line(&text)) return false;
    if (op_ != 'g' && op_ != 'p') return true;
    if (text.empty() || text.size() > 19 || text.find_first_not_of("0123456789") != std::string::npos)
      return malformed("a memo index that is not a small decimal number");
    *index = std::stoull(text);
    return true;
  }

  // ---------------------------------------------------------------- the stack
  uint64_t fence() const { return marks_.empty() ? 0 : marks_.back(); }
  bool push() {
    if (++height_ > limits_.max_stack)
      return refuse("more than " + std::to_string(limits_.max_stack) + " values on the unpickler's stack at once");
    if (height_ > out_.max_stack) out_.max_stack = height_;
    return true;
  }
  bool pop(uint64_t n) {
    if (height_ < fence() + n) return malformed("the stack underflows");
    height_ -= n;
    return true;
  }
  bool gather(uint64_t* items) {  // the items above the last mark; the mark is dropped
    if (marks_.empty()) return malformed("no mark to gather to");
    *items = height_ - marks_.back();
    height_ = marks_.back();
    marks_.pop_back();
    if (*items > limits_.max_batch)
      return refuse(std::to_string(*items) + " items gathered by one opcode, more than " +
                    std::to_string(limits_.max_batch));
    return true;
  }
  bool memo_put(uint64_t index) {
    if (index > memo_size_)
      return refuse("memo index " + std::to_string(index) + " skips past the " + std::to_string(memo_size_) +
                    " objects stored so far (a pickler numbers them in order; this would reserve memory for " +
                    std::to_string(index) + " of them)");
    if (index == memo_size_) ++memo_size_;
    out_.memo_puts = memo_size_;
    return height_ > fence() || malformed("nothing on the stack to store in the memo");
  }

  bool apply(Effect effect, uint64_t index) {
    uint64_t items = 0;
    switch (effect) {
      case Effect::kPush: return push();
      case Effect::kNoChange: return effect_needs_value() ? pop(1) && push() : true;
      case Effect::kPop1: return pop(1);
      case Effect::kPop2: return pop(2);
      case Effect::kPop:
        if (!marks_.empty() && marks_.back() == height_) {
          marks_.pop_back();
          return true;
        }
        return pop(1);
      case Effect::kMark:
        marks_.push_back(height_);
        if (marks_.size() > limits_.max_marks)
          return refuse("more than " + std::to_string(limits_.max_marks) + " marks open at once (nesting)");
        if (marks_.size() > out_.max_marks) out_.max_marks = marks_.size();
        return true;
      case Effect::kPopMark: return gather(&items);
      case Effect::kIntoBelow: return gather(&items) && (height_ > fence() || malformed("no container below the mark"));
      case Effect::kBuild: return gather(&items) && push();
      case Effect::kMemoPut: return memo_put(index);
      case Effect::kMemoize: return memo_put(memo_size_);
      case Effect::kMemoGet: ++out_.memo_gets; return push();
      case Effect::kStop:
        done_ = true;
        out_.parsed = true;
        return true;
    }
    return true;
  }
  static std::string byte_name(uint8_t b) {
    static const char* hex = "0123456789abcdef";
    return std::string("byte 0x") + hex[b >> 4] + hex[b & 15];
  }
  bool effect_needs_value() const { return op_ == 0x85 || op_ == 'Q' || op_ == 0x98; }  // TUPLE1 and the like

  bool step() {
    at_ = pos_;
    if (pos_ >= size_) return truncated();
    op_ = data_[pos_++];
    const Opcode& op = table().op[op_];
    if (op.arg == Arg::kBad) return malformed(byte_name(op_) + " is not a pickle opcode");
    uint64_t index = 0;
    if (!argument(op.arg, &index)) return false;
    ++out_.opcodes;
    return apply(op.effect, index);
  }

  const uint8_t* data_;
  size_t size_;
  PickleLimits limits_;
  size_t pos_ = 0;
  size_t at_ = 0;
  uint8_t op_ = 0;
  bool done_ = false;
  uint64_t height_ = 0;
  uint64_t memo_size_ = 0;
  std::vector<uint64_t> marks_;
  PickleScan out_;
};

}  // namespace

PickleScan scan_pickle(const uint8_t* data, size_t size, const PickleLimits& limits) {
  return Scanner(data, size, limits).run();
}

}  // namespace amem
