// errors.h — the exceptions the core throws. Each message says what was wrong
// and what to do; the bindings map them to Python exception types.
#pragma once

#include <stdexcept>
#include <string>

namespace amem {

// The backend could not supply memory even after the cache was released.
class OutOfMemoryError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A free of a pointer this allocator does not own, or a double free. The
// allocator's state is unchanged when this is thrown.
class InvalidFreeError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A request the allocator cannot express (e.g. larger than kMaxRequest).
class InvalidRequestError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The backend failed for a reason other than running out of memory.
class BackendError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace amem
