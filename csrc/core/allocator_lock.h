// allocator_lock.h — the lock that guards one device's allocator.
//
// Design note
// -----------
// Every malloc and free takes this lock once, so its uncontended cost is part
// of the hot path. std::mutex (glibc's pthread mutex) spends about 55
// instructions per lock+unlock on checks for mutex kinds we never use. This is
// the classic three-state futex lock (Drepper, "Futexes Are Tricky", mutex2):
//
//   0 free, 1 locked, 2 locked with sleepers.
//   lock:   one compare-exchange 0 -> 1; if taken, spin briefly, then mark 2
//           and sleep in the kernel until woken (a long wait, e.g. a device
//           synchronization inside empty_cache, costs the waiters no CPU).
//   unlock: one exchange to 0; only if it was 2 does it wake a sleeper.
//
// So the uncontended path is one atomic instruction each way, inlined.
// Off Linux it degrades to spinning with yields. ThreadSanitizer sees the
// acquire/release pairs on the atomic, so it still checks every access the
// lock guards.
#pragma once

#include <atomic>

namespace amem {

class AllocatorLock {
 public:
  void lock() {
    int expected = kFree;
    if (!state_.compare_exchange_strong(expected, kLocked, std::memory_order_acquire)) lock_contended();
  }
  bool try_lock() {
    int expected = kFree;
    return state_.compare_exchange_strong(expected, kLocked, std::memory_order_acquire);
  }
  void unlock() {
    if (state_.exchange(kFree, std::memory_order_release) == kSleepers) wake_one();
  }

 private:
  static constexpr int kFree = 0, kLocked = 1, kSleepers = 2;
  void lock_contended();
  void wake_one();
  std::atomic<int> state_{kFree};
};

}  // namespace amem
