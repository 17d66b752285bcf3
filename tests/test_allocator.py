"""Allocator (host and sim backends): split and merge, best fit, streams, errors, OOM, introspection."""
from __future__ import annotations

import ctypes
import random

import pytest

import amem_alloc
from amem_alloc import Allocator, InvalidFreeError, OutOfMemoryError

KiB = 1024
MiB = 1024 * KiB


def make(backend: str = "sim", **kwargs) -> Allocator:
    """An allocator that also runs the core's invariant walker after each of its own operations."""
    return Allocator(backend, debug_checks=True, **kwargs)


def layout(alloc: Allocator) -> list[tuple]:
    """Segments in address order, each as (size, stream, [(offset, size, state), ...])."""
    return [(s.total_size, s.stream, [(b.address - s.address, b.size, b.state) for b in s.blocks])
            for s in sorted(alloc.segments(), key=lambda s: s.address)]


def stat(alloc: Allocator, key: str) -> int:
    return alloc.memory_stats()[key]


# ------------------------------------------------------------------ split, merge, best fit, streams


def test_split_and_merge_in_a_small_segment():
    alloc = make("sim")
    a, b, c = (alloc.malloc(1000) for _ in range(3))
    alloc.check_valid()
    assert (b - a, c - a) == (1024, 2048)  # carved off the front, one after the other
    rest = 2 * MiB - 3 * 1024
    assert layout(alloc) == [(2 * MiB, 0, [(0, 1024, "active_allocated"), (1024, 1024, "active_allocated"),
                                           (2048, 1024, "active_allocated"), (3072, rest, "inactive")])]
    alloc.free(b)
    alloc.check_valid()
    assert [blk[2] for blk in layout(alloc)[0][2]] == ["active_allocated", "inactive", "active_allocated", "inactive"]
    assert stat(alloc, "inactive_split.all.current") == 2
    assert stat(alloc, "inactive_split_bytes.all.current") == 1024 + rest
    alloc.free(a)  # merges with b's free block
    alloc.check_valid()
    assert layout(alloc)[0][2] == [(0, 2048, "inactive"), (2048, 1024, "active_allocated"), (3072, rest, "inactive")]
    alloc.free(c)  # merges on both sides: the segment is one free block again
    alloc.check_valid()
    assert layout(alloc) == [(2 * MiB, 0, [(0, 2 * MiB, "inactive")])]
    assert stat(alloc, "inactive_split.all.current") == 0
    assert stat(alloc, "reserved_bytes.all.current") == 2 * MiB  # cached, not returned


def test_large_blocks_split_only_when_more_than_1_mib_remains():
    alloc = make("sim")
    exact = alloc.malloc(19 * MiB)  # 1 MiB would remain: not split, the block is the whole 20 MiB
    alloc.check_valid()
    assert alloc.block_info(exact)["size"] == 20 * MiB
    assert stat(alloc, "allocated_bytes.all.current") == 20 * MiB
    assert stat(alloc, "requested_bytes.all.current") == 19 * MiB
    split = alloc.malloc(19 * MiB - 512)  # 1 MiB + 512 remains: split
    alloc.check_valid()
    assert alloc.block_info(split)["size"] == 19 * MiB - 512
    seg = [s for s in layout(alloc) if s[2][0][1] != 20 * MiB][0]
    assert seg[2] == [(0, 19 * MiB - 512, "active_allocated"), (19 * MiB - 512, 1 * MiB + 512, "inactive")]
    alloc.free(exact)
    alloc.free(split)
    alloc.check_valid()


def test_best_fit_takes_the_smallest_hole_then_the_lowest_address():
    alloc = make("sim")
    sizes = [16 * KiB, 512, 4 * KiB, 512, 8 * KiB, 512, 4 * KiB, 512]
    ptrs = [alloc.malloc(s) for s in sizes]
    holes = {0: 16 * KiB, 2: 4 * KiB, 4: 8 * KiB, 6: 4 * KiB}
    for i in holes:
        alloc.free(ptrs[i])
        alloc.check_valid()
    assert alloc.malloc(4 * KiB) == ptrs[2]  # smallest hole that fits; of two equal, the lower
    assert alloc.malloc(4 * KiB) == ptrs[6]
    alloc.check_valid()
    five = alloc.malloc(5 * KiB)  # the 8 KiB hole, split: 3 KiB stays free after it
    assert five == ptrs[4]
    assert alloc.malloc(3 * KiB) == ptrs[4] + 5 * KiB
    assert alloc.malloc(9 * KiB) == ptrs[0]  # only the 16 KiB hole is big enough
    alloc.check_valid()


def test_blocks_are_reused_only_on_their_own_stream():
    alloc = make("sim")
    p = alloc.malloc(3 * MiB, stream=1)
    alloc.free(p)
    q = alloc.malloc(3 * MiB, stream=2)  # p's cached block belongs to stream 1
    alloc.check_valid()
    assert q != p
    assert stat(alloc, "segment.all.current") == 2 and stat(alloc, "num_device_alloc") == 2
    assert sorted(s.stream for s in alloc.segments()) == [1, 2]
    r = alloc.malloc(3 * MiB, stream=1)
    alloc.check_valid()
    assert r == p and stat(alloc, "num_device_alloc") == 2
    s1 = alloc.malloc(1000, stream=1)
    s2 = alloc.malloc(1000, stream=2)
    seg_of = {s.address: s.stream for s in alloc.segments()}
    assert seg_of[s1] == 1 and seg_of[s2] == 2  # each stream got its own small segment
    for x in (q, r, s1, s2):
        alloc.free(x)
    alloc.check_valid()


# ------------------------------------------------------------------ bad input


def test_size_zero_returns_null_and_changes_nothing():
    alloc = make("sim")
    keep = alloc.malloc(1000)
    before, segs = alloc.memory_stats(), alloc.segments()
    assert alloc.malloc(0) == 0
    assert alloc.malloc(0, stream=5) == 0
    alloc.free(0)  # freeing null is a no-op
    alloc.check_valid()
    assert alloc.memory_stats() == before and alloc.segments() == segs
    alloc.free(keep)


@pytest.mark.parametrize("size,error", [(-1, ValueError), (1.5, TypeError), ("64", TypeError), (None, TypeError),
                                        (True, TypeError), (2**56 + 1, ValueError), (2**64, ValueError)])
def test_bad_sizes_are_rejected_without_a_trace(size, error):
    alloc = make("sim")
    keep = alloc.malloc(1000)
    before, segs = alloc.memory_stats(), alloc.segments()
    with pytest.raises(error):
        alloc.malloc(size)
    alloc.check_valid()
    assert alloc.memory_stats() == before and alloc.segments() == segs
    alloc.free(keep)


def test_a_huge_size_is_an_invalid_request_not_an_oom():
    alloc = make("sim")
    with pytest.raises(amem_alloc.InvalidRequestError, match="larger than any device"):
        alloc.malloc(2**57)
    assert stat(alloc, "num_ooms") == 0
    with pytest.raises(ValueError):
        alloc.malloc(1, stream=-1)


def _bad_free_cases():
    def double(alloc, p):
        alloc.free(p)
        return p, "double free"

    def unknown(alloc, p):
        return 0x1234, "never returned"

    def interior(alloc, p):
        return p + 512, "points inside"

    def past_the_end(alloc, p):
        return max(s.address + s.total_size for s in alloc.segments()) + 4096, "never returned"

    return [double, unknown, interior, past_the_end]


@pytest.mark.parametrize("case", _bad_free_cases(), ids=lambda f: f.__name__)
@pytest.mark.parametrize("backend", ["sim", "host"])
def test_invalid_free_raises_and_changes_nothing(backend, case):
    alloc = make(backend)
    p = alloc.malloc(4096)
    other = alloc.malloc(3 * MiB)
    address, words = case(alloc, p)
    before, segs = alloc.memory_stats(), alloc.segments()
    with pytest.raises(InvalidFreeError, match=words) as info:
        alloc.free(address)
    assert isinstance(info.value, ValueError)
    assert f"{address:#x}" in str(info.value)
    alloc.check_valid()
    after = alloc.memory_stats()
    assert after.pop("num_invalid_frees") == before.pop("num_invalid_frees") + 1
    assert after == before and alloc.segments() == segs
    alloc.free(other)
    alloc.check_valid()


def test_bad_backend_names():
    for name in ("cuda", "gpu", "", "SIM"):
        with pytest.raises(ValueError, match="backend"):
            Allocator(name)


@pytest.mark.parametrize("kwargs,key", [
    ({"no_such_option": 1}, "no_such_option"),
    ({"max_split_size_mb": 10}, "max_split_size_mb"),
    ({"max_split_size_mb": "lots"}, "max_split_size_mb"),
    ({"max_non_split_rounding_mb": 1}, "max_non_split_rounding_mb"),
    ({"roundup_power2_divisions": 3}, "roundup_power2_divisions"),
    ({"roundup_power2_divisions": {300: 4}}, "roundup_power2_divisions"),
    ({"roundup_power2_divisions": [4]}, "roundup_power2_divisions"),
    ({"garbage_collection_threshold": 1.5}, "garbage_collection_threshold"),
    ({"garbage_collection_threshold": -0.25}, "garbage_collection_threshold"),
    ({"debug_checks": "maybe"}, "debug_checks"),
])
def test_bad_config_kwargs_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        Allocator("sim", **kwargs)


def test_bad_limit_bytes():
    with pytest.raises(ValueError):
        Allocator("sim", limit_bytes=-1)
    with pytest.raises(TypeError):
        Allocator("sim", limit_bytes="1G")


# ------------------------------------------------------------------ out of memory


def test_oom_frees_cached_segments_retries_then_fails_and_recovers():
    alloc = make("sim", limit_bytes=66 * MiB)
    a, b = alloc.malloc(2 * MiB), alloc.malloc(2 * MiB, stream=1)  # two 20 MiB segments
    alloc.free(a)
    alloc.free(b)
    alloc.check_valid()
    assert stat(alloc, "reserved_bytes.all.current") == 40 * MiB
    big = alloc.malloc(30 * MiB)  # 40 + 30 > 66: free both cached segments, then retry
    alloc.check_valid()
    s = alloc.memory_stats()
    assert (s["num_alloc_retries"], s["num_device_free"], s["num_device_alloc"], s["num_ooms"]) == (1, 2, 3, 0)
    assert s["reserved_bytes.all.current"] == 30 * MiB and s["segment.all.current"] == 1
    small = alloc.malloc(512 * KiB)  # a 2 MiB segment that stays split: 1.5 MiB largest free block
    alloc.check_valid()
    with pytest.raises(OutOfMemoryError) as info:
        alloc.malloc(45 * MiB)  # 32 MiB reserved, all of it in use: 45 MiB cannot fit in 66
    assert isinstance(info.value, MemoryError)
    msg = str(info.value)
    for figure in ("45.00 MiB", "32.00 MiB", "30.50 MiB", "34.00 MiB", "1.50 MiB"):
        assert figure in msg, (figure, msg)  # requested, reserved, allocated, device free, largest free
    for word in ("allocate", "Reserved", "allocated", "device free", "largest"):
        assert word in msg
    alloc.check_valid()
    s = alloc.memory_stats()
    assert (s["num_ooms"], s["num_alloc_retries"]) == (1, 2)
    assert s["reserved_bytes.all.current"] == 32 * MiB and s["allocated_bytes.all.current"] == 30 * MiB + 512 * KiB
    more = alloc.malloc(30 * MiB)  # still works: 32 + 30 <= 66
    alloc.check_valid()
    for p in (big, small, more):
        alloc.free(p)
        alloc.check_valid()
    alloc.empty_cache()
    assert stat(alloc, "reserved_bytes.all.current") == 0
    assert alloc.malloc(66 * MiB) != 0  # the whole capacity is usable again
    alloc.check_valid()


def test_oom_on_the_host_backend_too():
    alloc = make("host", limit_bytes=8 * MiB)
    with pytest.raises(OutOfMemoryError, match="host"):
        alloc.malloc(9 * MiB)
    assert stat(alloc, "num_ooms") == 1
    p = alloc.malloc(1 * MiB)
    alloc.free(p)
    alloc.check_valid()


# ------------------------------------------------------------------ record_stream


def test_record_stream_defers_reuse_while_the_stream_is_busy():
    alloc = make("sim")
    p = alloc.malloc(1 * MiB, stream=7)
    alloc.record_stream(p, 9)
    alloc.set_stream_busy(9)
    alloc.free(p)
    alloc.check_valid()
    states = {b.address: b.state for s in alloc.segments() for b in s.blocks}
    assert states[p] == "active_pending_free"
    s = alloc.memory_stats()
    assert s["allocated_bytes.all.current"] == 0 and s["active_bytes.all.current"] == 1 * MiB
    assert s["requested_bytes.all.current"] == 1 * MiB  # counted until the block is reusable
    with pytest.raises(InvalidFreeError, match="waits for other streams"):
        alloc.free(p)
    q = alloc.malloc(1 * MiB, stream=7)  # p is not reused: the rest of its segment serves
    assert q != p
    alloc.check_valid()
    alloc.set_stream_busy(9, False)
    r = alloc.malloc(1 * MiB, stream=7)  # the next malloc sees the event done and reuses p
    alloc.check_valid()
    assert r == p
    assert stat(alloc, "active_bytes.all.current") == 2 * MiB
    for x in (q, r):
        alloc.free(x)
    alloc.check_valid()


def test_record_stream_on_the_own_stream_is_ignored_and_empty_cache_synchronizes():
    alloc = make("sim")
    p = alloc.malloc(4096, stream=3)
    alloc.record_stream(p, 3)
    alloc.free(p)
    assert all(b.state == "inactive" for s in alloc.segments() for b in s.blocks)
    q = alloc.malloc(4096, stream=3)
    alloc.record_stream(q, 4)
    alloc.set_stream_busy(4)
    alloc.free(q)
    syncs = stat(alloc, "num_sync_all_streams")
    alloc.empty_cache()  # waits for stream 4, then the whole segment goes back
    alloc.check_valid()
    s = alloc.memory_stats()
    assert s["num_sync_all_streams"] == syncs + 1
    assert s["reserved_bytes.all.current"] == 0 and s["active_bytes.all.current"] == 0
    with pytest.raises(InvalidFreeError):
        alloc.record_stream(q, 5)


# ------------------------------------------------------------------ empty_cache, peaks, fragmentation


def test_empty_cache_returns_only_whole_free_segments():
    alloc = make("sim")
    kept = alloc.malloc(1000)  # its 2 MiB segment stays
    gone = [alloc.malloc(1000, stream=1), alloc.malloc(12 * MiB), alloc.malloc(3 * MiB)]
    for p in gone:
        alloc.free(p)
    alloc.check_valid()
    assert stat(alloc, "reserved_bytes.all.current") == 2 * MiB + 2 * MiB + 12 * MiB + 20 * MiB
    alloc.empty_cache()
    alloc.check_valid()
    s = alloc.memory_stats()
    assert s["reserved_bytes.all.current"] == 2 * MiB and s["num_device_free"] == 3
    assert s["segment.all.current"] == 1 and s["num_empty_cache"] == 1
    assert layout(alloc)[0][2][0] == (0, 1024, "active_allocated")
    alloc.free(kept)
    alloc.empty_cache()
    alloc.check_valid()
    assert alloc.segments() == [] and stat(alloc, "reserved_bytes.all.current") == 0


def test_reset_peak_memory_stats():
    alloc = make("sim")
    p = alloc.malloc(10 * MiB)
    alloc.free(p)
    q = alloc.malloc(1000)
    s = alloc.memory_stats()
    assert s["allocated_bytes.all.peak"] == 10 * MiB and s["requested_bytes.all.peak"] == 10 * MiB
    alloc.reset_peak_memory_stats()
    s = alloc.memory_stats()
    for name in ("allocated_bytes", "reserved_bytes", "requested_bytes", "active_bytes", "segment", "allocation"):
        for pool in ("all", "small_pool", "large_pool"):
            assert s[f"{name}.{pool}.peak"] == s[f"{name}.{pool}.current"], (name, pool)
    assert s["allocated_bytes.all.peak"] == 1024 and s["reserved_bytes.all.peak"] == 12 * MiB
    assert s["allocated_bytes.all.allocated"] == 10 * MiB + 1024  # totals are not peaks: kept
    alloc.free(q)
    alloc.check_valid()


def test_fragmentation_fields_by_hand():
    alloc = make("sim")
    a = alloc.malloc(1000)  # 1024 in a 2 MiB small segment
    b = alloc.malloc(3000)  # 3072
    c = alloc.malloc(2 * MiB)  # 2 MiB in a 20 MiB large segment, 18 MiB free after it
    alloc.free(a)
    alloc.check_valid()
    f = alloc.fragmentation()
    reserved, allocated, requested = 22 * MiB, 3072 + 2 * MiB, 3000 + 2 * MiB
    free_blocks = [1024, 2 * MiB - 4096, 18 * MiB]
    assert (f.reserved_bytes, f.allocated_bytes, f.requested_bytes) == (reserved, allocated, requested)
    assert f.unused_reserved_bytes == reserved - allocated == sum(free_blocks)
    assert f.fragmentation == pytest.approx(1 - allocated / reserved, abs=1e-6)
    assert (f.free_bytes, f.largest_free_block) == (sum(free_blocks), 18 * MiB)
    assert f.external_fragmentation == pytest.approx(1 - 18 * MiB / sum(free_blocks), abs=1e-6)
    assert f.internal_fragmentation_bytes == allocated - requested == 72
    assert f.internal_fragmentation == pytest.approx(72 / allocated, abs=1e-6)
    # The reserved peak (22 MiB) was reached by c's segment; allocated was highest right after c.
    assert f.peak_reserved_bytes == 22 * MiB and f.allocated_bytes_at_reserved_peak == 1024 + allocated
    assert f.fragmentation_at_reserved_peak == pytest.approx(1 - (1024 + allocated) / reserved, abs=1e-6)
    for p in (b, c):
        alloc.free(p)
    f = alloc.fragmentation()
    assert (f.allocated_bytes, f.largest_free_block, f.external_fragmentation) == (0, 20 * MiB, pytest.approx(1 - 20 / 22, abs=1e-6))


# ------------------------------------------------------------------ host memory is real


def test_host_blocks_hold_what_is_written():
    alloc = make("host")
    p, q = alloc.malloc(4096), alloc.malloc(4096)
    big = alloc.malloc(3 * MiB)
    ctypes.memset(p, 0xAB, 4096)
    ctypes.memset(q, 0xCD, 4096)
    ctypes.memset(big, 0x5A, 3 * MiB)
    assert ctypes.string_at(p, 4096) == b"\xab" * 4096
    assert ctypes.string_at(q, 4096) == b"\xcd" * 4096
    assert ctypes.string_at(big + 3 * MiB - 16, 16) == b"\x5a" * 16
    alloc.free(p)
    ctypes.memset(q, 0xEE, 4096)  # a neighbour's bytes stay its own
    assert ctypes.string_at(q, 4096) == b"\xee" * 4096
    for x in (q, big):
        alloc.free(x)
    alloc.check_valid()


def test_host_blocks_never_overlap_under_random_use():
    rng = random.Random(42)
    alloc = make("host", limit_bytes=512 * MiB)
    live: dict[int, tuple[int, int]] = {}  # address -> (size, fill byte)
    for step in range(600):
        if live and rng.random() < 0.45:
            p = rng.choice(list(live))
            size, fill = live.pop(p)
            assert ctypes.string_at(p, size) == bytes([fill]) * size, f"block {p:#x} was overwritten"
            alloc.free(p)
        else:
            size = rng.choice([rng.randint(1, 4 * KiB), rng.randint(1, 1 * MiB), rng.randint(1 * MiB, 6 * MiB)])
            p = alloc.malloc(size, stream=rng.randint(0, 2))
            fill = step % 251 + 1
            ctypes.memset(p, fill, size)
            live[p] = (size, fill)
        alloc.check_valid()
    for p, (size, fill) in live.items():
        assert ctypes.string_at(p, size) == bytes([fill]) * size
        alloc.free(p)
    alloc.check_valid()
    assert stat(alloc, "allocated_bytes.all.current") == 0


def test_double_free_after_the_block_merged_says_so():
    a = Allocator("sim", debug_checks=True)
    p, q = a.malloc(1000), a.malloc(1000)
    a.free(p)
    a.free(q)                                     # q merges into p's free block: q is no block start
    before = a.memory_stats()
    with pytest.raises(InvalidFreeError, match="lies in cached free memory.*double free"):
        a.free(q)
    after = a.memory_stats()
    assert after["num_invalid_frees"] == before["num_invalid_frees"] + 1
    a.check_valid()
