"""Python threads on one Allocator: the binding releases the GIL in malloc/free/empty_cache, so
these calls really run at the same time and only the core's lock keeps its state whole."""
from __future__ import annotations

import ctypes
import random
import sys
import threading

import pytest

from amem_alloc import Allocator, InvalidFreeError

KiB = 1024
MiB = 1024 * KiB
SIZE_CLASSES = [(1, 4 * KiB), (4 * KiB, 1 * MiB), (1 * MiB, 10 * MiB), (10 * MiB, 24 * MiB)]


@pytest.fixture(autouse=True)
def frequent_switches():
    """Switch threads every microsecond instead of every 5 ms, so the calls interleave densely."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def run_threads(n: int, target) -> list[BaseException]:
    """Runs target(index, barrier) on n threads started together; returns what they raised."""
    barrier = threading.Barrier(n, timeout=60)
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            target(i, barrier)
        except BaseException as e:  # reported by the test, not lost in the thread
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread is stuck (deadlock?)"
    return errors


def assert_empty(alloc: Allocator) -> None:
    alloc.check_valid()
    s = alloc.memory_stats()
    for name in ("allocated_bytes", "active_bytes", "requested_bytes", "allocation", "active"):
        assert s[f"{name}.all.current"] == 0, name
    assert all(b.state == "inactive" for seg in alloc.segments() for b in seg.blocks)


@pytest.mark.parametrize("n_threads", [4, 8])
def test_threads_on_their_own_streams(n_threads):
    alloc = Allocator("sim")
    steps = 5000
    totals: dict[int, int] = {}

    def work(i: int, barrier: threading.Barrier) -> None:
        rng = random.Random(1000 + i)
        stream = i + 1
        live: list[int] = []
        mallocs = 0
        barrier.wait()
        for step in range(steps):
            if live and rng.random() < 0.45:
                alloc.free(live.pop(rng.randrange(len(live))))
            else:
                lo, hi = rng.choice(SIZE_CLASSES)
                p = alloc.malloc(rng.randint(lo, hi), stream)
                assert p != 0 and p not in live
                info = alloc.block_info(p)
                assert info is not None and info["address"] == p and info["stream"] == stream
                live.append(p)
                mallocs += 1
            if step % 300 == 0:
                alloc.check_valid()  # the walker under the lock, while others run
            if step % 500 == 499:
                alloc.empty_cache()
        for p in live:
            alloc.free(p)
        totals[i] = mallocs

    errors = run_threads(n_threads, work)
    assert not errors, errors
    assert_empty(alloc)
    s = alloc.memory_stats()
    assert s["allocation.all.allocated"] == sum(totals.values())  # every malloc counted once
    assert s["allocation.all.freed"] == sum(totals.values())
    assert {seg.stream for seg in alloc.segments()} <= set(range(1, n_threads + 1))
    alloc.empty_cache()
    alloc.check_valid()
    assert alloc.memory_stats()["reserved_bytes.all.current"] == 0 and alloc.segments() == []


def test_threads_sharing_a_stream_never_get_overlapping_host_memory():
    alloc = Allocator("host", limit_bytes=1024 * MiB)
    n_threads = 6

    def work(i: int, barrier: threading.Barrier) -> None:
        rng = random.Random(77 + i)
        fill = i + 1
        live: list[tuple[int, int]] = []
        barrier.wait()
        for _ in range(400):
            if live and rng.random() < 0.45:
                p, size = live.pop(rng.randrange(len(live)))
                assert ctypes.string_at(p, size) == bytes([fill]) * size, f"thread {i}: block {p:#x} overwritten"
                alloc.free(p)
            else:
                size = rng.choice([rng.randint(1, 4 * KiB), rng.randint(1, 512 * KiB), rng.randint(1 * MiB, 3 * MiB)])
                p = alloc.malloc(size, rng.choice([0, 1]))  # streams shared by all threads
                ctypes.memset(p, fill, size)
                live.append((p, size))
        for p, size in live:
            assert ctypes.string_at(p, size) == bytes([fill]) * size
            alloc.free(p)

    errors = run_threads(n_threads, work)
    assert not errors, errors
    assert_empty(alloc)


def test_concurrent_frees_of_one_pointer_one_wins():
    alloc = Allocator("sim")
    rounds = 200
    outcomes: list[list[str]] = [[] for _ in range(rounds)]
    pointers: list[int] = [0] * rounds
    ready = threading.Barrier(3, timeout=60)
    messages: list[str] = []

    def racer() -> None:
        for r in range(rounds):
            ready.wait()  # the main thread has allocated pointers[r]
            try:
                alloc.free(pointers[r])
                outcomes[r].append("freed")
            except InvalidFreeError as e:
                messages.append(str(e))
                outcomes[r].append("invalid")
            ready.wait()  # both are done with this round

    def main_loop() -> None:
        rng = random.Random(5)
        for r in range(rounds):
            pointers[r] = alloc.malloc(rng.choice([1000, 3 * MiB, 12 * MiB]))
            ready.wait()
            ready.wait()
            alloc.check_valid()

    racers = [threading.Thread(target=racer) for _ in range(2)]
    for t in racers:
        t.start()
    main_loop()
    for t in racers:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in racers)
    for r, result in enumerate(outcomes):
        assert sorted(result) == ["freed", "invalid"], (r, result)
    assert all("already freed" in m for m in messages), messages[:3]
    assert alloc.memory_stats()["num_invalid_frees"] == rounds
    assert_empty(alloc)
