"""Size classes: rounding, pool choice and segment sizes (torch's native policy), through the pure
functions in amem_alloc._C and through what a real Allocator hands out."""
from __future__ import annotations

import random

import pytest

from amem_alloc import Allocator, _C
from reference_model import KiB, MiB
from reference_model import is_small as model_is_small
from reference_model import round_size as model_round_size
from reference_model import segment_size as model_segment_size

GiB = 1024 * MiB

# request -> (block size, small pool?, new segment size)
TABLE = [
    (1, 512, True, 2 * MiB),
    (511, 512, True, 2 * MiB),
    (512, 512, True, 2 * MiB),
    (513, 1024, True, 2 * MiB),
    (1000, 1024, True, 2 * MiB),
    (4096, 4096, True, 2 * MiB),
    (4097, 4608, True, 2 * MiB),
    (1 * MiB - 1, 1 * MiB, True, 2 * MiB),
    (1 * MiB, 1 * MiB, True, 2 * MiB),  # the largest small request
    (1 * MiB + 1, 1 * MiB + 512, False, 20 * MiB),  # the smallest large request
    (5 * MiB, 5 * MiB, False, 20 * MiB),
    (10 * MiB - 513, 10 * MiB - 512, False, 20 * MiB),  # the last 20 MiB-segment request
    (10 * MiB - 1, 10 * MiB, False, 10 * MiB),  # rounds to 10 MiB: a segment of its own size
    (10 * MiB, 10 * MiB, False, 10 * MiB),
    (10 * MiB + 1, 10 * MiB + 512, False, 12 * MiB),  # >= 10 MiB: rounded up to 2 MiB
    (11 * MiB, 11 * MiB, False, 12 * MiB),
    (20 * MiB, 20 * MiB, False, 20 * MiB),
    (39 * MiB + 1, 39 * MiB + 512, False, 40 * MiB),
    (1 * GiB, 1 * GiB, False, 1 * GiB),
]


@pytest.mark.parametrize("size,block,small,segment", TABLE)
def test_rounding_table_pure_functions(size, block, small, segment):
    rounded = _C.round_size(size, "")
    assert rounded == block
    assert rounded % 512 == 0
    assert _C.is_small(rounded) is small
    assert _C.segment_size(rounded) == segment


@pytest.mark.parametrize("size,block,small,segment", TABLE)
def test_rounding_table_in_a_real_allocator(size, block, small, segment):
    alloc = Allocator("sim")
    p = alloc.malloc(size)
    alloc.check_valid()
    # A fresh segment is split only if the rest is worth keeping: >= 512 B (small), > 1 MiB (large).
    split = segment - block >= 512 if small else segment - block > 1 * MiB
    given = block if split else segment
    info = alloc.block_info(p)
    assert (info["address"], info["size"], info["requested_size"]) == (p, given, size)
    [seg] = alloc.segments()
    assert seg.total_size == segment
    assert seg.segment_type == ("small" if small else "large")
    assert seg.address == p
    assert [(b.size, b.state) for b in seg.blocks] == [(given, "active_allocated")] + (
        [(segment - block, "inactive")] if split else [])
    stats = alloc.memory_stats()
    pool = "small_pool" if small else "large_pool"
    assert stats[f"allocated_bytes.{pool}.current"] == given
    assert stats[f"reserved_bytes.{pool}.current"] == segment
    assert stats[f"requested_bytes.{pool}.current"] == size
    alloc.free(p)
    alloc.check_valid()


def test_pure_functions_agree_with_the_reference_model_on_random_sizes():
    rng = random.Random(1234)
    sizes = [rng.randint(1, 64 * MiB) for _ in range(3000)] + [rng.randint(1, 8 * KiB) for _ in range(500)]
    for size in sizes:
        rounded = _C.round_size(size, "")
        assert rounded == model_round_size(size), size
        assert rounded >= size and rounded - size < 512
        assert _C.is_small(rounded) == model_is_small(rounded)
        assert _C.segment_size(rounded) == model_segment_size(rounded)
        assert _C.segment_size(rounded) >= rounded


def test_small_requests_never_use_large_segments():
    alloc = Allocator("sim")
    big = alloc.malloc(2 * MiB)  # a 20 MiB large segment, 18 MiB of it free
    small = alloc.malloc(1000)
    alloc.check_valid()
    segs = {s.segment_type: s for s in alloc.segments()}
    assert set(segs) == {"small", "large"}
    assert segs["small"].address <= small < segs["small"].address + segs["small"].total_size
    assert segs["small"].total_size == 2 * MiB
    alloc.free(big)
    alloc.free(small)
    alloc.check_valid()


def test_large_requests_never_use_small_segments():
    alloc = Allocator("sim")
    small = alloc.malloc(4096)  # a 2 MiB small segment, almost all free
    large = alloc.malloc(1 * MiB + 1)  # fits in that free space, but belongs to the large pool
    alloc.check_valid()
    assert alloc.memory_stats()["segment.all.current"] == 2
    [seg] = [s for s in alloc.segments() if s.segment_type == "large"]
    assert seg.address == large and seg.total_size == 20 * MiB
    alloc.free(small)
    alloc.free(large)
    alloc.check_valid()


def test_mid_sized_requests_share_a_20_mib_segment():
    alloc = Allocator("sim")
    ptrs = [alloc.malloc(4 * MiB) for _ in range(5)]  # 5 x 4 MiB fill one 20 MiB segment exactly
    alloc.check_valid()
    [seg] = alloc.segments()
    assert seg.total_size == 20 * MiB
    assert ptrs == [seg.address + i * 4 * MiB for i in range(5)]
    assert len(seg.blocks) == 5  # the last one took the 4 MiB rest whole (rest 0 is not split)
    sixth = alloc.malloc(4 * MiB)
    alloc.check_valid()
    assert alloc.memory_stats()["segment.all.current"] == 2 and sixth not in ptrs
    for p in ptrs + [sixth]:
        alloc.free(p)
        alloc.check_valid()


def test_big_requests_get_a_segment_of_their_own_rounded_to_2_mib():
    alloc = Allocator("sim")
    a = alloc.malloc(13 * MiB + 5)
    b = alloc.malloc(13 * MiB + 5)
    alloc.check_valid()
    segs = sorted(alloc.segments(), key=lambda s: s.address)
    assert [s.total_size for s in segs] == [14 * MiB, 14 * MiB]
    # 14 MiB - (13 MiB + 512) is under 1 MiB: the block is not split, so it holds the whole segment
    assert [len(s.blocks) for s in segs] == [1, 1]
    assert alloc.block_info(a)["size"] == 14 * MiB and alloc.block_info(b)["size"] == 14 * MiB
    assert alloc.memory_stats()["allocated_bytes.all.current"] == 28 * MiB
    alloc.free(a)
    alloc.free(b)
    alloc.check_valid()


# ------------------------------------------------------------------ roundup_power2_divisions

DIVISION_EXAMPLES = [
    # (conf value, request, block size)
    ("4", 1200, 1536),  # 1200 <= 512 x 4: plain 512-byte rounding
    ("4", 4700, 5120),  # (4 KiB, 8 KiB) in steps of 1 KiB
    ("4", 1 * MiB + 1, 1 * MiB + 256 * KiB),
    ("4", 5 * MiB + 1, 6 * MiB),
    ("4", 4 * MiB, 4 * MiB),  # a power of two stays as it is
    ("4", 6 * MiB, 6 * MiB),  # already on a step
    ("2", 5 * MiB + 1, 6 * MiB),
    ("8", 5 * MiB + 1, 5 * MiB + 512 * KiB),
    ("16", 5000, 5120),  # 5000 <= 512 x 16: plain rounding
    ("16", 100 * MiB + 1, 104 * MiB),  # (64 MiB, 128 MiB) in steps of 4 MiB
    ("1", 5 * MiB + 1, 5 * MiB + 512),  # 1 division: plain rounding
    ("0", 5 * MiB + 1, 5 * MiB + 512),  # 0: off
    ("[256:4,512:2]", 5 * MiB + 1, 6 * MiB),  # the first entry also covers every interval below
    ("[256:4,512:2]", 300 * MiB + 1, 320 * MiB),
    ("[256:4,512:2]", 600 * MiB + 1, 768 * MiB),
    ("[256:4,512:2]", 2 * GiB + 1, 2 * GiB + 512),  # intervals after the last entry: off
]


@pytest.mark.parametrize("divisions,size,block", DIVISION_EXAMPLES)
def test_roundup_power2_divisions_examples(divisions, size, block):
    assert _C.round_size(size, f"roundup_power2_divisions:{divisions}") == block


@pytest.mark.parametrize("divisions", [2, 4, 8, 16])
def test_roundup_power2_divisions_agree_with_the_model(divisions):
    rng = random.Random(divisions)
    conf = f"roundup_power2_divisions:{divisions}"
    for _ in range(2000):
        size = rng.randint(1, 1 << rng.randint(10, 36))
        rounded = _C.round_size(size, conf)
        assert rounded == model_round_size(size, [divisions] * 16), (size, divisions)
        assert rounded >= size and rounded % 512 == 0


def test_roundup_power2_divisions_through_an_allocator():
    alloc = Allocator("sim", roundup_power2_divisions=4)
    p = alloc.malloc(5 * MiB + 1)
    q = alloc.malloc(4700)
    alloc.check_valid()
    assert alloc.block_info(p)["size"] == 6 * MiB
    assert alloc.block_info(q)["size"] == 5120
    assert alloc.memory_stats()["requested_bytes.all.current"] == 5 * MiB + 1 + 4700
    listed = Allocator("sim", roundup_power2_divisions={256: 4, 512: 2})
    r = listed.malloc(600 * MiB + 1)
    listed.check_valid()
    assert listed.block_info(r)["size"] == 768 * MiB
    assert [s.total_size for s in listed.segments()] == [768 * MiB]


# '>' fills only the intervals after the last listed one, as current torch does (older
# releases also overwrote the last listed interval).
@pytest.mark.parametrize("conf,size,block", [
    ("[256:4,512:2,>:1]", 600 * MiB + 1, 768 * MiB),  # 512 MiB interval: 2 divisions, not 1
    ("[256:1,512:2,1024:4,>:8]", 1 * GiB + 1, 1280 * MiB),  # torch docs' example: 1 GiB -> 4
    ("[256:4,>:8]", 256 * MiB + 1, 320 * MiB),
])
def test_roundup_power2_divisions_greater_than_keeps_the_last_listed_interval(conf, size, block):
    assert _C.round_size(size, f"roundup_power2_divisions:{conf}") == block
