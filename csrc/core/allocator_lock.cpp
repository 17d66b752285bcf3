// allocator_lock.cpp — the contended half of AllocatorLock (see allocator_lock.h).
#include "allocator_lock.h"

#include <thread>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace amem {
namespace {

constexpr int kSpins = 100;  // about a microsecond: longer than most critical sections here

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

#if defined(__linux__)
static_assert(sizeof(std::atomic<int>) == sizeof(int), "futex needs a plain int");
int* futex_word(std::atomic<int>& state) { return reinterpret_cast<int*>(&state); }
#endif

}  // namespace

void AllocatorLock::lock_contended() {
  for (int i = 0; i < kSpins; ++i) {
    cpu_relax();
    int expected = kFree;
    if (state_.load(std::memory_order_relaxed) == kFree &&
        state_.compare_exchange_weak(expected, kLocked, std::memory_order_acquire))
      return;
  }
  // From here on the lock is held as "with sleepers", so the unlocker wakes us.
  while (state_.exchange(kSleepers, std::memory_order_acquire) != kFree) {
#if defined(__linux__)
    syscall(SYS_futex, futex_word(state_), FUTEX_WAIT_PRIVATE, kSleepers, nullptr, nullptr, 0);
#else
    std::this_thread::yield();
#endif
  }
}

void AllocatorLock::wake_one() {
#if defined(__linux__)
  syscall(SYS_futex, futex_word(state_), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
#endif
}

}  // namespace amem
