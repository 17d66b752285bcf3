"""The C++ replay loop (csrc/core/replay.h): keys map to this allocator's addresses, out of memory
and unknown frees are counted without stopping, peaks equal the allocator's own, the timeline is
bounded."""
import numpy as np
import pytest

from amem_alloc import Allocator

MiB = 1 << 20
OPS = np.dtype([("key", "<u8"), ("size", "<u8"), ("stream", "<u8"), ("kind", "<u8")])


def program(*ops):
    """ops: ("alloc", key, size[, stream]) or ("free", key)."""
    out = np.zeros(len(ops), OPS)
    for i, op in enumerate(ops):
        if op[0] == "alloc":
            out[i] = (op[1], op[2], op[3] if len(op) > 3 else 0, 0)
        else:
            out[i] = (op[1], 0, 0, 1)
    return out.tobytes()


def test_replay_matches_the_same_calls_made_directly():
    ops = [("alloc", 1, 3 * MiB), ("alloc", 2, 1000, 7), ("free", 1), ("alloc", 3, 25 * MiB), ("free", 2)]
    replayed = Allocator("sim", debug_checks=True)
    result = replayed._core.replay(program(*ops), 100)
    direct, live = Allocator("sim"), {}
    for op in ops:
        if op[0] == "alloc":
            live[op[1]] = direct.malloc(op[2], op[3] if len(op) > 3 else 0)
        else:
            direct.free(live.pop(op[1]))
    stats, mine = direct.memory_stats(), replayed.memory_stats()
    for key in ("allocated_bytes.all.current", "reserved_bytes.all.peak", "allocated_bytes.all.peak",
                "num_device_alloc", "requested_bytes.all.current"):
        assert mine[key] == stats[key], key
    assert result["peak_reserved"] == stats["reserved_bytes.all.peak"]
    assert result["peak_allocated"] == stats["allocated_bytes.all.peak"]
    assert (result["ops"], result["allocs"], result["frees"]) == (5, 3, 2)


def test_out_of_memory_and_unknown_frees_are_counted_and_the_run_goes_on():
    a = Allocator("sim", limit_bytes=40 * MiB)
    result = a._core.replay(program(("free", 99), ("alloc", 1, 30 * MiB), ("alloc", 2, 30 * MiB),
                                    ("free", 2), ("free", 1), ("alloc", 3, 5 * MiB), ("free", 3)), 10)
    assert result["unknown_frees"] == 2          # key 99 never allocated; key 2 failed, so its free is unknown
    assert result["failed_allocs"] == 1
    # key 3 needs a new 20 MiB segment: only after the cached 30 MiB one is released (a retry)
    assert a.memory_stats()["num_alloc_retries"] == 1
    assert a.memory_stats()["allocated_bytes.all.current"] == 0
    a.check_valid()


def test_an_alloc_of_a_live_key_frees_the_old_block_first():
    a = Allocator("sim")
    result = a._core.replay(program(("alloc", 1, 4096), ("alloc", 1, 8192), ("free", 1)), 10)
    assert result["duplicate_allocs"] == 1 and a.memory_stats()["allocation.all.current"] == 0


def test_timeline_is_bounded_and_ends_with_the_last_operation():
    n = 20000
    ops = [("alloc", i, 4096 + i) if i % 2 == 0 else ("free", i - 1) for i in range(n)]
    result = Allocator("sim")._core.replay(program(*ops), 50)
    assert 50 <= len(result["samples"]) <= 50 + 200   # evenly spaced points plus new peaks
    assert result["samples"][-1][0] == n - 1
    assert max(s[2] for s in result["samples"]) == result["peak_reserved"]


def test_malformed_program_is_a_clear_error():
    with pytest.raises(ValueError, match="32-byte records"):
        Allocator("sim")._core.replay(b"\x00" * 33, 10)
