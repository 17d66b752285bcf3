// pickle_scan.h — reads a pickle's opcodes without building anything, to bound what unpickling
// it would cost before Python's own (C) unpickler runs it.
//
// Design note
// -----------
// amem_alloc.load_snapshot unpickles untrusted files with CPython's C unpickler (refusing every
// class lookup), which is fast (a 19k-event trace in 70 ms) but trusts the file's sizes: a
// 9-byte pickle that stores one object under memo index 2^28 makes it allocate and clear a 4 GB
// memo array. Python's pure unpickler keeps its memo in a dict but is 10x slower, and a scan in
// Python (pickletools.genops) takes longer than the unpickling itself. So this walks the opcodes
// once in C++ (a few ms for the same trace) and refuses, before anything is built:
//
//   * a memo index beyond those already stored (a pickler numbers its memo 0, 1, 2, ... in
//     order, so an index past the count is never written by one; the memo then stays at most
//     twice the file's objects),
//   * more marks open at once, or more values on the stack, or more items gathered into one
//     container by one opcode, than the limits allow.
//
// Everything else the unpickler checks itself (unknown opcodes, truncation, class lookups,
// lengths past the end): a file the scan cannot parse is left for the unpickler to reject with
// its own message, since the scan has then vouched for every opcode before the bad one. Sharing
// (one object referenced many times) costs the unpickler nothing; what readers do with shared
// objects is bounded by the Python checker (amem_alloc/snapshot/load.py).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace amem {

struct PickleLimits {
  uint64_t max_marks = 1000;        // marks open at once (a snapshot nests a handful)
  uint64_t max_stack = 1u << 20;    // values on the unpickler's stack at once
  uint64_t max_batch = 1u << 20;    // items one opcode (APPENDS, SETITEMS, TUPLE, ...) gathers
};

struct PickleScan {
  bool refused = false;      // a limit was passed: `problem` says which, at byte `offset`
  bool parsed = false;       // the scan reached STOP (false: malformed; the unpickler will say why)
  std::string problem;
  uint64_t offset = 0;
  uint64_t opcodes = 0;
  uint64_t memo_puts = 0;    // objects stored in the memo
  uint64_t memo_gets = 0;    // references to stored objects
  uint64_t max_stack = 0;    // the most values on the stack at once
  uint64_t max_marks = 0;    // the most marks open at once
};

PickleScan scan_pickle(const uint8_t* data, size_t size, const PickleLimits& limits);

}  // namespace amem
