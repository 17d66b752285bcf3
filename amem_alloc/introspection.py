"""What an allocator holds: stats, segments with their blocks, fragmentation.

The core exports these as JSON (so Python never depends on C++ struct layout); this module turns
that JSON into plain dicts and small dataclasses, the same for every backend.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class BlockInfo:
    address: int
    size: int  # bytes, a multiple of 512
    requested_size: int  # bytes the caller asked for (0 when inactive)
    stream: int  # the stream its segment serves
    state: str  # torch's names: active_allocated, active_pending_free, inactive
    alloc_seq: int  # allocation sequence number (0 if never allocated)


@dataclass(frozen=True)
class SegmentInfo:
    address: int
    total_size: int
    stream: int
    segment_type: str  # "small" or "large"
    is_expandable: bool  # part of an expandable segment (one entry per mapped range)
    segment_pool_id: tuple  # (0, 0) for the shared pools, else the private pool's id
    allocated_size: int
    active_size: int
    requested_size: int
    blocks: list[BlockInfo] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Fragmentation:
    reserved_bytes: int
    allocated_bytes: int
    requested_bytes: int
    unused_reserved_bytes: int  # reserved - allocated
    fragmentation: float  # 1 - allocated / reserved, now
    peak_reserved_bytes: int
    allocated_bytes_at_reserved_peak: int
    fragmentation_at_reserved_peak: float  # 1 - allocated / reserved at the reserved peak
    free_bytes: int  # cached free blocks
    largest_free_block: int
    external_fragmentation: float  # 1 - largest free / total free
    internal_fragmentation_bytes: int  # rounded - requested
    internal_fragmentation: float  # (rounded - requested) / rounded

    def to_dict(self) -> dict:
        return asdict(self)


def parse_stats(text: str) -> dict[str, int]:
    return json.loads(text) if text else {}


def parse_segments(text: str) -> list[SegmentInfo]:
    segments = []
    for seg in json.loads(text) if text else []:
        blocks = [BlockInfo(**b) for b in seg.pop("blocks")]
        seg["segment_pool_id"] = tuple(seg["segment_pool_id"])
        segments.append(SegmentInfo(**seg, blocks=blocks))
    return segments


def parse_fragmentation(text: str) -> Fragmentation:
    return Fragmentation(**json.loads(text)) if text else Fragmentation(0, 0, 0, 0, 0.0, 0, 0, 0.0, 0, 0, 0.0, 0, 0.0)


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def summary(stats: dict[str, int], frag: Fragmentation) -> str:
    """A short human-readable account of an allocator's memory."""
    rows = [
        ("allocated", stats.get("allocated_bytes.all.current", 0), stats.get("allocated_bytes.all.peak", 0)),
        ("reserved", stats.get("reserved_bytes.all.current", 0), stats.get("reserved_bytes.all.peak", 0)),
        ("requested", stats.get("requested_bytes.all.current", 0), stats.get("requested_bytes.all.peak", 0)),
    ]
    lines = [f"{'':<10} {'current':>12} {'peak':>12}"]
    lines += [f"{name:<10} {format_bytes(cur):>12} {format_bytes(peak):>12}" for name, cur, peak in rows]
    lines.append(
        f"segments: {stats.get('segment.all.current', 0)} now, {stats.get('num_device_alloc', 0)} device mallocs, "
        f"{stats.get('num_device_free', 0)} device frees, {stats.get('num_alloc_retries', 0)} retries, "
        f"{stats.get('num_ooms', 0)} OOMs"
    )
    lines.append(
        f"fragmentation: {frag.fragmentation:.1%} now, {frag.fragmentation_at_reserved_peak:.1%} at the reserved peak; "
        f"largest free block {format_bytes(frag.largest_free_block)}; external {frag.external_fragmentation:.1%}; "
        f"internal (rounding) {format_bytes(frag.internal_fragmentation_bytes)}"
    )
    return "\n".join(lines)
