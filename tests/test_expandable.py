"""expandable_segments:True — one growing segment per stream and pool, mapped in 2 MiB (small) and
20 MiB (large) pages, as torch does (docs/torch_policy.md §6). Expected figures are derived from
those page sizes; every step runs the is_valid() walker (debug_checks)."""
import ctypes
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amem_alloc import Allocator, OutOfMemoryError

MiB = 1 << 20
SMALL_PAGE, LARGE_PAGE = 2 * MiB, 20 * MiB


def expandable(backend="sim", **kw):
    return Allocator(backend, expandable_segments=True, debug_checks=True, **kw)


def test_requests_share_one_segment_per_pool_and_map_whole_pages():
    a = expandable(limit_bytes=8 << 30)
    ptrs = [a.malloc(n) for n in (1000, 3 * MiB, 25 * MiB, 7 * MiB, 200)]
    stats = a.memory_stats()
    # small: 1000 + 200 bytes fit one 2 MiB page; large: 3 + 25 + 7 = 35 MiB -> two 20 MiB pages
    assert stats["reserved_bytes.small_pool.current"] == SMALL_PAGE
    assert stats["reserved_bytes.large_pool.current"] == 2 * LARGE_PAGE
    assert stats["num_device_alloc"] == 3             # one map each time the segment had to grow
    assert stats["segment.all.current"] == 0          # torch does not count expandable segments
    segs = a.segments()
    assert sorted((s.segment_type, s.total_size, s.is_expandable) for s in segs) == [
        ("large", 2 * LARGE_PAGE, True), ("small", SMALL_PAGE, True)]
    large = next(s for s in segs if s.segment_type == "large")
    assert [b.address for b in large.blocks] == sorted(b.address for b in large.blocks)
    assert large.blocks[1].address == large.blocks[0].address + 3 * MiB   # contiguous: one growing range
    for p in ptrs:
        a.free(p)
    a.empty_cache()
    stats = a.memory_stats()
    assert stats["reserved_bytes.all.current"] == 0 and stats["num_device_free"] == 2  # two unmaps
    assert a.segments() == []


def test_each_stream_gets_its_own_segment():
    a = expandable()
    p, q = a.malloc(5 * MiB, stream=1), a.malloc(5 * MiB, stream=2)
    segs = a.segments()
    assert len(segs) == 2 and {s.stream for s in segs} == {1, 2}
    a.free(p)
    r = a.malloc(5 * MiB, stream=2)                # stream 1's free block is not reused on stream 2
    assert r != p
    a.free(q), a.free(r)


def test_any_remainder_of_512_bytes_or_more_is_split_off():
    a = expandable()
    p = a.malloc(11 * MiB)                          # plain segments would not split a 12 MiB segment
    q = a.malloc(4 * MiB)
    assert q == p + 11 * MiB                        # the remainder of the 20 MiB page served it
    assert a.memory_stats()["reserved_bytes.all.current"] == LARGE_PAGE


def test_empty_cache_unmaps_only_whole_free_pages():
    a = expandable()
    keep = a.malloc(21 * MiB)                       # maps two pages (40 MiB)
    tail = a.malloc(10 * MiB)                       # 21..31 MiB
    a.free(tail)
    a.empty_cache()                                 # free 21..40 MiB: only the page 20..40 is not whole
    assert a.memory_stats()["reserved_bytes.all.current"] == 2 * LARGE_PAGE
    a.free(keep)
    a.empty_cache()
    assert a.memory_stats()["reserved_bytes.all.current"] == 0


def test_out_of_memory_with_a_limit_and_recovery():
    a = expandable(limit_bytes=60 * MiB)
    held = [a.malloc(20 * MiB) for _ in range(3)]
    with pytest.raises(OutOfMemoryError):
        a.malloc(20 * MiB)
    assert a.memory_stats()["num_ooms"] == 1
    freed = held.pop()
    a.free(freed)
    again = a.malloc(20 * MiB)                      # the freed page is reused, no new mapping
    assert again == freed and a.memory_stats()["num_device_alloc"] == 3
    for p in [*held, again]:
        a.free(p)
    a.empty_cache()
    assert a.memory_stats()["reserved_bytes.all.current"] == 0


def test_host_backend_blocks_are_writable_memory():
    a = expandable("host", limit_bytes=256 * MiB)
    ptrs = [(a.malloc(n), n) for n in (4096, 3 * MiB, 30 * MiB)]
    for i, (p, n) in enumerate(ptrs):
        ctypes.memset(p, i + 1, n)
    for i, (p, n) in enumerate(ptrs):
        assert ctypes.string_at(p, 16) == bytes([i + 1]) * 16 and ctypes.string_at(p + n - 16, 16) == bytes([i + 1]) * 16
        a.free(p)
    a.empty_cache()
    assert a.memory_stats()["reserved_bytes.all.current"] == 0


# Equal mid-sized tensors too: repeated growth by one size is what amem's map_ahead maps ahead for.
SIZES = st.one_of(st.integers(1, 4096), st.integers(4097, MiB), st.integers(MiB + 1, 12 * MiB),
                  st.integers(12 * MiB, 45 * MiB), st.sampled_from([4 * MiB, 2 * MiB + 256 * 1024]))


# torch's pages, and amem's policy (fine pages, map_ahead, page reclaim, handover) on the same checks.
@pytest.mark.parametrize("policy", [None, "amem"])
@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["malloc", "free", "empty"]), SIZES, st.integers(0, 2)),
                min_size=1, max_size=80))
def test_random_sequences_keep_every_invariant(policy, ops):
    a = expandable(limit_bytes=256 * MiB, policy=policy)
    live, requested = [], 0
    for op, size, stream in ops:
        if op == "malloc":
            try:
                live.append((a.malloc(size, stream), size))
                requested += size
            except OutOfMemoryError:
                pass
        elif op == "free" and live:
            p, n = live.pop(size % len(live))
            a.free(p)
            requested -= n
        elif op == "empty":
            a.empty_cache()
        stats = a.memory_stats()                     # debug_checks already walked the heap
        assert stats["requested_bytes.all.current"] == requested
        assert stats["reserved_bytes.all.current"] <= 256 * MiB
    for p, _ in live:
        a.free(p)
    a.empty_cache()
    assert a.memory_stats()["reserved_bytes.all.current"] == 0


def test_seeded_long_run_on_both_backends_gives_identical_figures():
    def run(backend):
        rng, a, live = random.Random(7), expandable(backend, limit_bytes=512 * MiB), []
        for _ in range(3000):
            if live and rng.random() < 0.45:
                a.free(live.pop(rng.randrange(len(live))))
            else:
                try:
                    live.append(a.malloc(rng.choice([rng.randint(1, MiB), rng.randint(MiB, 40 * MiB)]),
                                         rng.randrange(3)))
                except OutOfMemoryError:
                    a.empty_cache()
        s = a.memory_stats()
        return {k: s[k] for k in ("reserved_bytes.all.peak", "allocated_bytes.all.peak", "num_device_alloc",
                                  "num_device_free", "num_ooms")}
    assert run("sim") == run("host")
