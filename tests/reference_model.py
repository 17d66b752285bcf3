"""A small, readable pure-Python model of amem's default policy (PyTorch's native policy).

It is the oracle that tests/test_reference_model.py runs beside Allocator(backend="sim"). It
models only what the default options do (no max_split_size, no garbage collection, no
record_stream) and favours plain lists and linear scans over speed:

  * rounding: 512-byte steps (optionally roundup_power2_divisions); pools: small <= 1 MiB;
  * segments: 2 MiB (small), 20 MiB (large, < 10 MiB), else the request rounded to 2 MiB;
  * best fit: the smallest free block of the same pool and stream, lowest address on ties;
  * split: small if >= 512 bytes remain, large if > 1 MiB remains; merge free neighbours on free;
  * out of memory: return every cached whole segment to the device, retry once, then fail.

The device is modelled like the sim backend: first fit from the top of the free address ranges in
2 MiB steps (each new segment at the highest free address, as cudaMalloc hands them out: Note
[segment addresses descend] in csrc/backends/sim_backend.cpp), with a capacity limit. Addresses here start at ADDRESS_BASE, so compare with the sim by position (segments
in address order, offsets within a segment), not by absolute value.
"""
from __future__ import annotations

from dataclasses import dataclass, field

KiB = 1024
MiB = 1024 * KiB

MIN_BLOCK_SIZE = 512  # every block is a multiple of this
SMALL_SIZE = 1 * MiB  # requests up to this go to the small pool
SMALL_BUFFER = 2 * MiB  # small-pool segment size
MIN_LARGE_ALLOC = 10 * MiB  # large requests below this get a LARGE_BUFFER segment
LARGE_BUFFER = 20 * MiB  # large-pool segment size for mid-sized requests
ROUND_LARGE = 2 * MiB  # bigger requests get a segment rounded up to this
ADDRESS_STEP = 2 * MiB  # the sim device hands out addresses in these steps
ADDRESS_BASE = 1 << 40  # the model's first address (not 0: that is the null pointer)
ADDRESS_SPACE = 1 << 46  # bytes of simulated address space
UNLIMITED = 1 << 60  # the sim device's capacity when no limit is given


# ------------------------------------------------------------------ size policy


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """Round up to the next 1/divisions step of size's power-of-two interval."""
    if size & (size - 1) == 0:
        return size
    floor_pow2 = 1 << (size.bit_length() - 1)
    step = floor_pow2 // divisions
    if step == 0:
        return floor_pow2 * 2
    rounded_down = size - size % step
    return size if rounded_down == size else rounded_down + step


def divisions_for(size: int, table: list[int] | None) -> int:
    """The roundup_power2_divisions entry for size: table[i] covers [2^(20+i), 2^(21+i))."""
    if not table:
        return 0
    index = min(max(size.bit_length() - 1 - 20, 0), len(table) - 1)
    return table[index]


def round_size(size: int, divisions: list[int] | None = None) -> int:
    if size < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    d = divisions_for(size, divisions)
    if d > 1 and size > MIN_BLOCK_SIZE * d:
        return roundup_power2_next_division(size, d)
    return -(-size // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE


def is_small(rounded: int) -> bool:
    return rounded <= SMALL_SIZE


def segment_size(rounded: int) -> int:
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-rounded // ROUND_LARGE) * ROUND_LARGE


def should_split(small: bool, block_size: int, rounded: int) -> bool:
    remaining = block_size - rounded
    return remaining >= MIN_BLOCK_SIZE if small else remaining > SMALL_SIZE


# ------------------------------------------------------------------ the device


class Device:
    """The sim backend: first fit from the top over free address ranges, merged on release, with a limit."""

    def __init__(self, limit_bytes: int = 0):
        self.capacity = limit_bytes or UNLIMITED
        self.used = 0
        self.free_ranges: list[list[int]] = [[ADDRESS_BASE, ADDRESS_SPACE]]  # [address, bytes], sorted

    def allocate(self, size: int) -> int | None:
        if size > self.capacity - self.used:
            return None
        span = -(-size // ADDRESS_STEP) * ADDRESS_STEP
        for i in reversed(range(len(self.free_ranges))):
            address, length = self.free_ranges[i]
            if length >= span:
                if length == span:
                    del self.free_ranges[i]
                else:
                    self.free_ranges[i] = [address, length - span]
                self.used += size
                return address + length - span
        return None

    def release(self, address: int, size: int) -> None:
        span = -(-size // ADDRESS_STEP) * ADDRESS_STEP
        self.free_ranges.append([address, span])
        self.free_ranges.sort()
        merged: list[list[int]] = []
        for start, length in self.free_ranges:
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1][1] += length
            else:
                merged.append([start, length])
        self.free_ranges = merged
        self.used -= size


# ------------------------------------------------------------------ blocks and stats


@dataclass
class Block:
    offset: int  # from the start of its segment
    size: int
    allocated: bool = False
    requested: int = 0  # bytes asked for; 0 when free


@dataclass
class Segment:
    address: int
    size: int
    stream: int
    small: bool
    blocks: list[Block] = field(default_factory=list)  # tiles the segment in address order

    def is_whole_and_free(self) -> bool:
        return len(self.blocks) == 1 and not self.blocks[0].allocated


@dataclass
class Stat:
    current: int = 0
    peak: int = 0

    def add(self, n: int) -> None:
        self.current += n
        self.peak = max(self.peak, self.current)


POOL_STATS = ("allocation", "segment", "active", "allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes")
COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free")


class ModelOutOfMemory(Exception):
    pass


class ReferenceAllocator:
    def __init__(self, limit_bytes: int = 0, divisions: list[int] | None = None):
        self.device = Device(limit_bytes)
        self.divisions = divisions
        self.segments: list[Segment] = []  # kept in address order
        self.stats = {name: {p: Stat() for p in ("all", "small_pool", "large_pool")} for name in POOL_STATS}
        self.counters = dict.fromkeys(COUNTERS, 0)

    def _add(self, name: str, small: bool, n: int) -> None:
        self.stats[name]["all"].add(n)
        self.stats[name]["small_pool" if small else "large_pool"].add(n)

    # -------------------------------------------------------------- requests

    def malloc(self, size: int, stream: int = 0) -> int:
        if size == 0:
            return 0
        rounded = round_size(size, self.divisions)
        small = is_small(rounded)
        found = self._best_fit(small, stream, rounded) or self._new_segment(small, stream, rounded)
        if found is None:  # free every cached whole segment, then retry once
            self.empty_cache()
            self.counters["num_alloc_retries"] += 1
            found = self._new_segment(small, stream, rounded)
        if found is None:
            self.counters["num_ooms"] += 1
            raise ModelOutOfMemory(f"{size} bytes ({rounded} rounded) on stream {stream}")
        segment, index = found
        return self._allocate(segment, index, rounded, size)

    def free(self, address: int) -> None:
        if address == 0:
            return
        segment, index = self._find(address)
        block = segment.blocks[index]
        assert block.allocated, f"model: {address:#x} is not allocated"
        for name, n in (("allocation", 1), ("allocated_bytes", block.size), ("active", 1),
                        ("active_bytes", block.size), ("requested_bytes", block.requested)):
            self._add(name, segment.small, -n)
        block.allocated, block.requested = False, 0
        self._merge_around(segment, index)

    def empty_cache(self) -> None:
        self.counters["num_sync_all_streams"] += 1
        for segment in [s for s in self.segments if s.is_whole_and_free()]:
            self.device.release(segment.address, segment.size)
            self.segments.remove(segment)
            self.counters["num_device_free"] += 1
            self._add("segment", segment.small, -1)
            self._add("reserved_bytes", segment.small, -segment.size)

    # -------------------------------------------------------------- policy steps

    def _best_fit(self, small: bool, stream: int, rounded: int) -> tuple[Segment, int] | None:
        candidates = [
            (block.size, segment.address + block.offset, segment, i)
            for segment in self.segments
            if segment.small == small and segment.stream == stream
            for i, block in enumerate(segment.blocks)
            if not block.allocated and block.size >= rounded
        ]
        if not candidates:
            return None
        _, _, segment, index = min(candidates, key=lambda c: (c[0], c[1]))
        return segment, index

    def _new_segment(self, small: bool, stream: int, rounded: int) -> tuple[Segment, int] | None:
        size = segment_size(rounded)
        address = self.device.allocate(size)
        if address is None:
            return None
        segment = Segment(address, size, stream, small, [Block(0, size)])
        self.segments.append(segment)
        self.segments.sort(key=lambda s: s.address)
        self.counters["num_device_alloc"] += 1
        self._add("segment", small, 1)
        self._add("reserved_bytes", small, size)
        return segment, 0

    def _allocate(self, segment: Segment, index: int, rounded: int, requested: int) -> int:
        block = segment.blocks[index]
        if should_split(segment.small, block.size, rounded):
            rest = Block(block.offset + rounded, block.size - rounded)
            segment.blocks.insert(index + 1, rest)
            block.size = rounded
        block.allocated, block.requested = True, requested
        for name, n in (("allocation", 1), ("allocated_bytes", block.size), ("active", 1),
                        ("active_bytes", block.size), ("requested_bytes", requested)):
            self._add(name, segment.small, n)
        return segment.address + block.offset

    def _merge_around(self, segment: Segment, index: int) -> None:
        blocks = segment.blocks
        if index + 1 < len(blocks) and not blocks[index + 1].allocated:
            blocks[index].size += blocks.pop(index + 1).size
        if index > 0 and not blocks[index - 1].allocated:
            blocks[index - 1].size += blocks.pop(index).size

    def _find(self, address: int) -> tuple[Segment, int]:
        for segment in self.segments:
            for i, block in enumerate(segment.blocks):
                if segment.address + block.offset == address:
                    return segment, i
        raise KeyError(f"model: no block at {address:#x}")

    # -------------------------------------------------------------- what it holds

    def memory_stats(self) -> dict[str, int]:
        """The same keys as Allocator.memory_stats() (current and peak, plus the counters)."""
        out: dict[str, int] = dict(self.counters)
        for name, pools in self.stats.items():
            for pool, stat in pools.items():
                out[f"{name}.{pool}.current"] = stat.current
                out[f"{name}.{pool}.peak"] = stat.peak
        for pool, small in (("small_pool", True), ("large_pool", False)):
            split_free = [b for s in self.segments if s.small == small and len(s.blocks) > 1
                          for b in s.blocks if not b.allocated]
            out[f"inactive_split.{pool}.current"] = len(split_free)
            out[f"inactive_split_bytes.{pool}.current"] = sum(b.size for b in split_free)
        for name in ("inactive_split", "inactive_split_bytes"):
            out[f"{name}.all.current"] = out[f"{name}.small_pool.current"] + out[f"{name}.large_pool.current"]
        return out

    def layout(self) -> list[tuple]:
        """Segments in address order: (size, stream, kind, ((offset, size, state, requested), ...))."""
        return [
            (s.size, s.stream, "small" if s.small else "large",
             tuple((b.offset, b.size, "active_allocated" if b.allocated else "inactive", b.requested)
                   for b in s.blocks))
            for s in self.segments
        ]

    def position(self, address: int) -> tuple[int, int]:
        """(index of the segment in address order, offset within it) of an address we returned."""
        for i, segment in enumerate(self.segments):
            if segment.address <= address < segment.address + segment.size:
                return i, address - segment.address
        raise KeyError(f"model: {address:#x} is in no segment")
