"""Replay programs (amem_alloc/replay.py): packing, the C++ loop with and without segment recording, and turning torch
traces into programs — traces that start mid-run, several devices and streams, free_requested vs
free_completed, cache releases, and start states that cannot be rebuilt."""
import numpy as np
import pytest

from amem_alloc import policies, replay
from amem_alloc.snapshot import parse_snapshot
from amem_alloc.workloads import training_events

MiB = 1 << 20


# ---------------------------------------------------------------------------- helpers
def ev(action, addr, size, stream=0):
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": 0, "frames": []}


def snapshot(*device_traces, segments=()):
    return parse_snapshot({"segments": list(segments), "device_traces": [list(t) for t in device_traces]})


def segment(addr, size, blocks, stream=0, device=0, kind="large"):
    """blocks: (offset, size, state) with state 'a' (active) or 'i' (inactive)."""
    return {"device": device, "address": addr, "total_size": size, "stream": stream, "segment_type": kind,
            "blocks": [{"address": addr + off, "size": n, "requested_size": n,
                        "state": "active_allocated" if st == "a" else "inactive"} for off, n, st in blocks]}


def alloc_free(addr, size, stream=0):
    return [ev("alloc", addr, size, stream), ev("free_requested", addr, size, stream),
            ev("free_completed", addr, size, stream)]


def kinds(tp):
    return tp.program.ops["kind"].tolist()


# ---------------------------------------------------------------------------- programs and the loop
def test_program_round_trip(tmp_path):
    p = replay.program_from_events([("alloc", 1, 4096, 0), ("alloc", 2, 3 * MiB, 7), ("free", 1, 0, 0)])
    assert p.ops.dtype == replay.OPS and p.ops.itemsize == 32
    assert p.ops[1].tolist() == (2, 3 * MiB, 7, replay.ALLOC)
    q = replay.Program.load(p.save(tmp_path / "p.npz"))
    assert np.array_equal(p.ops, q.ops) and (q.prologue, q.device) == (0, 0)


def test_pack_makes_the_records_a_record_per_op_made():
    import random

    rng = random.Random(3)
    ops = [(rng.choice(replay.CORE_KINDS), rng.randrange(1 << 64), rng.randrange(1 << 40), rng.randrange(1 << 64))
           for _ in range(5000)] + [(True, np.uint64(1 << 63), np.int64(7), 0), (2, 1.9, 0, 0)]
    expected = np.array([(key, size, stream, kind) for kind, key, size, stream in ops], dtype=replay.OPS)
    assert replay.pack(ops).tobytes() == expected.tobytes()
    assert replay.pack(iter(ops[:10])).tobytes() == expected[:10].tobytes()  # any iterable
    assert replay.pack([]).dtype == replay.OPS and len(replay.pack(iter(()))) == 0
    with pytest.raises(ValueError, match="kind, key, size, stream"):
        replay.pack([(replay.ALLOC, 1, 2, 0), (replay.FREE, 1, 0)])
    with pytest.raises(OverflowError):
        replay.pack([(replay.ALLOC, -1, 2, 0)])


def test_amem_replay_reads_a_recorded_program(tmp_path, capsys):
    from amem_alloc.cli import main as amem

    path = replay.program_from_events(training_events(steps=2, layers=2)).save(tmp_path / "p.npz")
    assert amem(["replay", str(path), "--policy", "torch,torch-expandable", "--json", str(tmp_path / "r.json")]) == 0
    text = capsys.readouterr().out
    assert "a program recorded by amem compare" in text and "torch-expandable" in text


def test_recording_segment_events_changes_no_figure():
    program = replay.program_from_events(training_events(steps=3, layers=4, max_seq=512))
    core = replay.run(program, "", max_samples=len(program))
    step = replay.run(program, "", max_samples=len(program), record_segments=True)
    assert core.segment_events is None and core.final_segments is None
    for field in ("peak_allocated", "peak_reserved", "allocated_at_peak", "device_mallocs", "device_frees",
                  "allocs", "frees", "unknown_frees", "timeline"):
        assert getattr(core, field) == getattr(step, field), field
    assert step.device_mallocs == sum(a == "segment_alloc" for a, _ in step.segment_events) > 0
    assert step.device_frees == sum(a == "segment_free" for a, _ in step.segment_events)


def test_the_segment_log_agrees_with_the_core_trace():
    """The C++ loop's segment events are the ones the core's own trace records, op for op."""
    import json

    program = replay.program_from_events(training_events(steps=2, layers=3, max_seq=512))
    for conf in ("", "expandable_segments:True"):
        run = replay.run(program, conf, record_segments=True)
        core = replay.program._core(conf, 0)
        core.start_trace(1 << 20)
        core.replay(program.core_bytes(), 1)
        events = json.loads(core.trace_json())["events"]
        traced = [(e["action"], e["size"]) for e in events if e["action"] in replay.SEGMENT_ACTIONS]
        assert run.segment_events == traced and traced, conf
        expandable = conf != ""
        assert (run.device_maps > 0) == expandable and run.device_maps == sum(a == "segment_map" for a, _ in traced)


def test_replay_program_is_the_benchmark_hook():
    program = replay.program_from_events(training_events(steps=2, layers=2, max_seq=256))
    out = replay.replay_program(program.to_bytes(), "expandable_segments:True")
    assert out["ops"] == len(program) and out["ops_per_second"] > 0
    assert out["peak_reserved"] == out["stats"]["reserved_bytes.all.peak"]


def test_a_release_op_empties_the_cache():
    p = replay.Program(replay.pack([(replay.ALLOC, 1, 30 * MiB, 0), (replay.FREE, 1, 0, 0),
                                    (replay.RELEASE, 0, 0, 0), (replay.ALLOC, 2, 30 * MiB, 0)]))
    core = replay.run(p, "")
    assert core.releases == 1 and (core.device_mallocs, core.device_frees) == (2, 1)
    run = replay.run(p, "", record_segments=True)
    assert run.releases == 1
    assert run.segment_events == [("segment_alloc", 30 * MiB), ("segment_free", 30 * MiB),
                                  ("segment_alloc", 30 * MiB)]


def test_recording_segments_agrees_with_a_prologue_and_releases():
    ops = [(replay.ALLOC, 1, 25 * MiB, 0), (replay.ALLOC, 2, 3 * MiB, 0), (replay.FREE, 2, 0, 0),  # prologue
           (replay.ALLOC, 3, 4 * MiB, 0), (replay.FREE, 1, 0, 0), (replay.RELEASE, 0, 0, 0),
           (replay.ALLOC, 4, 1000, 1), (replay.FREE, 3, 0, 0)]
    p = replay.Program(replay.pack(ops), prologue=3)
    core = replay.run(p, "", max_samples=len(p))
    step = replay.run(p, "", max_samples=len(p), record_segments=True)
    # after the prologue only: the 4 MiB request reuses the prologue's cached 20 MiB segment
    assert step.segment_events == [("segment_free", 26 * MiB), ("segment_alloc", 2 * MiB)]
    for field in ("ops", "peak_allocated", "peak_reserved", "device_mallocs", "device_frees", "releases",
                  "allocs", "frees"):
        assert getattr(core, field) == getattr(step, field), field
    # 25 MiB gets a 26 MiB segment whose 1 MiB rest is not split off (large blocks split only when more
    # than 1 MiB remains), so it counts 26 MiB; the prologue's 3 MiB block was gone before it ended
    assert core.peak_allocated == 26 * MiB + 4 * MiB


def test_an_unknown_op_kind_is_refused_before_anything_runs():
    from amem_alloc import Allocator

    bad = replay.pack([(replay.ALLOC, 1, 4096, 0), (7, 0, 0, 0)]).tobytes()
    a = Allocator("sim")
    with pytest.raises(ValueError, match="op 1 has unknown kind 7"):
        a._core.replay(bad, 10)
    assert a.memory_stats()["allocation.all.current"] == 0


def test_policies_are_core_configurations():
    for name in policies.POLICIES:
        run = replay.run(replay.program_from_events(training_events(steps=1, layers=2)), policies.get(name).conf)
        assert run.peak_reserved >= run.peak_allocated > 0
    assert policies.get("conf:max_split_size_mb:64").conf == "max_split_size_mb:64"
    with pytest.raises(ValueError, match="unknown policy"):
        policies.get("fastest")
    with pytest.raises(ValueError):
        policies.get("conf:no_such_option:1")


# ---------------------------------------------------------------------------- traces -> programs
def test_a_trace_from_the_start_reproduces_its_segment_events():
    trace = [ev("segment_alloc", 0x1000000, 20 * MiB), *alloc_free(0x1000000, 3 * MiB),
             ev("segment_alloc", 0x3000000, 2 * MiB), ev("alloc", 0x3000000, 1000)]
    snap = snapshot(trace, segments=[segment(0x1000000, 20 * MiB, [(0, 20 * MiB, "i")]),
                                     segment(0x3000000, 2 * MiB, [(0, 1024, "a"), (1024, 2 * MiB - 1024, "i")],
                                             kind="small")])
    tp = replay.trace_program(snap, 0)
    assert (tp.start, tp.program.prologue, tp.free_action) == ("empty", 0, "free_completed")
    run = replay.run(tp.program, "", record_segments=True)
    assert run.segment_events == [(a, s) for _, a, s in tp.native.segment_events]
    assert run.peak_reserved == tp.native.peak_reserved == 22 * MiB


def test_frees_count_at_free_completed_not_free_requested():
    # block 1 is freed (requested) before block 2 is allocated, but completes only after:
    # memory was not reusable, so torch needed a second segment, and so must the replay
    trace = [ev("alloc", 0xA000000, 15 * MiB), ev("free_requested", 0xA000000, 15 * MiB),
             ev("alloc", 0xB000000, 15 * MiB), ev("free_completed", 0xA000000, 15 * MiB)]
    tp = replay.trace_program(snapshot(trace), 0)
    assert kinds(tp) == [replay.ALLOC, replay.ALLOC, replay.FREE]
    assert replay.run(tp.program, "").device_mallocs == 2


def test_a_trace_with_only_free_requested_uses_those():
    tp = replay.trace_program(snapshot([ev("alloc", 0xA000000, 4096), ev("free_requested", 0xA000000, 4096)]), 0)
    assert tp.free_action == "free_requested" and kinds(tp) == [replay.ALLOC, replay.FREE]


def test_a_free_with_no_alloc_is_a_block_live_before_recording():
    trace = [ev("alloc", 0x5000000, 2 * MiB), ev("free_completed", 0x7000000, 5 * MiB)]
    tp = replay.trace_program(snapshot(trace), 0)
    assert tp.program.prologue == 1
    assert tp.program.ops[0].tolist() == (0x7000000, 5 * MiB, 0, replay.ALLOC)
    run = replay.run(tp.program, "")
    assert run.unknown_frees == 0 and run.frees == 1


def test_blocks_active_at_the_end_but_never_traced_are_preallocated():
    seg = segment(0x9000000, 20 * MiB, [(0, 6 * MiB, "a"), (6 * MiB, 14 * MiB, "i")])
    tp = replay.trace_program(snapshot([*alloc_free(0x9000000 + 6 * MiB, 3 * MiB)], segments=[seg]), 0)
    assert tp.start == "rebuilt" and 0x9000000 in tp.program.ops["key"][: tp.program.prologue].tolist()
    run = replay.run(tp.program, "", record_segments=True)
    assert run.segment_events == [] and run.final_segments == replay.segment_layouts([seg])


def test_the_cached_state_at_the_start_is_rebuilt_block_for_block():
    # a 20 MiB segment cached before recording: block [0, 6) live (freed in the trace), [6, 20) free.
    # torch served the 12 MiB request from the free tail, so no new segment appears in the trace
    seg = segment(0x9000000, 20 * MiB, [(0, 8 * MiB, "a"), (8 * MiB, 12 * MiB, "i")])
    trace = [ev("alloc", 0x9000000 + 6 * MiB, 12 * MiB), ev("free_completed", 0x9000000, 6 * MiB),
             ev("free_completed", 0x9000000 + 6 * MiB, 12 * MiB), ev("alloc", 0x9000000, 8 * MiB)]
    tp = replay.trace_program(snapshot(trace, segments=[seg]), 0)
    assert tp.start == "rebuilt" and tp.native.initial_reserved == 20 * MiB
    run = replay.run(tp.program, "", record_segments=True)
    assert run.segment_events == [] and run.peak_reserved == 20 * MiB
    assert run.final_segments == replay.segment_layouts([seg])


def test_several_devices_and_streams():
    d0 = [ev("segment_alloc", 0x1000000, 20 * MiB, 5), ev("alloc", 0x1000000, 3 * MiB, 5)]
    d1 = [ev("segment_alloc", 0x1000000, 2 * MiB, 9), ev("alloc", 0x1000000, 512, 9),
          ev("segment_alloc", 0x2000000, 2 * MiB, 11), ev("alloc", 0x2000000, 512, 11)]
    tps = replay.trace_programs(snapshot(d0, [], d1))
    assert [tp.device for tp in tps] == [0, 2]
    run = replay.run(tps[1].program, "", record_segments=True)
    assert run.segment_events == [("segment_alloc", 2 * MiB)] * 2  # one small segment per stream


def test_a_run_of_segment_frees_is_a_cache_release():
    trace = [ev("segment_alloc", 0x1000000, 30 * MiB), *alloc_free(0x1000000, 30 * MiB),
             ev("segment_free", 0x1000000, 30 * MiB),
             ev("segment_alloc", 0x1000000, 30 * MiB), ev("alloc", 0x1000000, 30 * MiB)]
    tp = replay.trace_program(snapshot(trace), 0)
    assert tp.releases == 1 and kinds(tp) == [replay.ALLOC, replay.FREE, replay.RELEASE, replay.ALLOC]
    run = replay.run(tp.program, "", record_segments=True)
    assert run.segment_events == [(a, s) for _, a, s in tp.native.segment_events]


def test_an_expandable_trace_that_starts_mid_run_says_why_it_cannot_be_reproduced():
    trace = [ev("segment_map", 0x1000000, 20 * MiB), ev("alloc", 0x1000000, 4 * MiB),
             ev("free_completed", 0x1000000 + 4 * MiB, 4 * MiB)]  # a block from before recording
    seg = segment(0x1000000, 20 * MiB, [(0, 4 * MiB, "a"), (4 * MiB, 16 * MiB, "i")])
    seg["is_expandable"] = True
    tp = replay.trace_program(snapshot(trace, segments=[seg]), 0)
    assert tp.start == "unknown" and not tp.reproducible
    assert "expandable segments were already mapped" in tp.start_reason
    assert tp.program.prologue == 1  # the live block is still allocated first


def test_a_trace_without_segment_events_outside_its_final_segments_is_unknown():
    seg = segment(0x1000000, 20 * MiB, [(0, 20 * MiB, "i")])
    tp = replay.trace_program(snapshot([*alloc_free(0x7000000, 3 * MiB)], segments=[seg]), 0)
    assert tp.start == "unknown" and "outside the final segments" in tp.start_reason


def test_oom_events_are_noted_not_replayed():
    trace = [ev("alloc", 0x1000000, 4096), {"action": "oom", "device_free": 123, "size": 80 << 30, "stream": 0,
                                            "time_us": 0, "frames": []}]
    tp = replay.trace_program(snapshot(trace), 0)
    assert tp.native.ooms == [{"op": 1, "size": 80 << 30, "device_free": 123, "reserved_change": 0}]
    assert len(tp.program) == 1


def test_amem_replay_says_when_and_why_a_trace_cannot_be_reproduced(tmp_path, capsys):
    from amem_alloc.cli import main as amem
    from amem_alloc.snapshot import save_snapshot

    seg = segment(0x1000000, 20 * MiB, [(0, 4 * MiB, "a"), (4 * MiB, 16 * MiB, "i")])
    seg["is_expandable"] = True
    trace = [ev("segment_map", 0x1000000, 20 * MiB), ev("alloc", 0x1000000, 4 * MiB),
             ev("free_completed", 0x1000000 + 4 * MiB, 4 * MiB)]
    path = save_snapshot(snapshot(trace, segments=[seg]), tmp_path / "mid.pickle")
    assert amem(["replay", str(path)]) == 0
    text = capsys.readouterr().out
    assert "start: unknown (NOT reproducible): expandable segments were already mapped" in text
    assert "fidelity: not measured: the start state is unknown" in text
