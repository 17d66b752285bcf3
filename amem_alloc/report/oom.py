"""Out-of-memory forensics: for each `oom` event of a device, what was asked, what was free, why it
failed, what held the memory, and which allocator setting would have avoided it.

Design note
-----------
At an `oom` event the trace gives the request and the device's free memory (torch records it
after releasing its cache and retrying). The state at that moment comes from the timeline:
allocated and reserved bytes, and the segments with their free gaps (timeline.segments_at).

* fragmentation — the request failed although the free memory of the cache's segments plus the
  device's free memory would have held it: the free bytes were there, split into pieces smaller
  than the request. Otherwise the memory was simply in use.
* what would have avoided it — replayed, not guessed: the device's program (replay.trace_program)
  up to the failed request, plus that request, runs under each policy of amem_alloc/policies.py
  on a simulated device whose capacity is what this process could use at that moment (reserved
  bytes + the device's free bytes). A policy "fits" when none of those requests fails; its spare
  memory is that capacity minus the most it reserved.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..introspection import format_bytes
from .breakdown import BlockLabels, held_at
from ..snapshot.callsite import CallSites
from ..timeline import DeviceTimeline, free_runs, segments_at

OOM_KEY = (1 << 62) + 1  # the failed request's key in the replayed program: no trace address is this high
MAX_PANELS = 8     # out-of-memory errors shown per device (a retry loop can log hundreds)
MAX_REPLAYED = 3   # of those, replayed under every policy


def _verdict(size: int, device_free: int, cache_free: int, largest: int) -> tuple[bool, str]:
    total = cache_free + device_free
    if total >= size:
        return True, (f"Fragmentation: {format_bytes(cache_free)} free in the cache, largest block "
                      f"{format_bytes(largest)} < the {format_bytes(size)} request, and {format_bytes(device_free)} "
                      f"free on the device: {format_bytes(total)} free in all, but not in one piece.")
    return False, (f"Not fragmentation: {format_bytes(total)} free in all ({format_bytes(cache_free)} in the cache, "
                   f"{format_bytes(device_free)} on the device) for a {format_bytes(size)} request; "
                   f"{format_bytes(size - total)} more was in use than the device could spare.")


def _replay_policies(snapshot: dict, device: int, k: int, size: int, stream: int, capacity: int) -> dict[str, Any]:
    from .. import policies, replay

    try:
        tp = replay.trace_program(snapshot, device)
    except Exception as err:  # the report must not fail for a trace replay cannot read
        return {"rows": [], "note": f"Not replayed: the trace could not be read as a program ({err})."}
    if k >= len(tp.native.ooms):
        return {"rows": [], "note": "Not replayed: the program has no out-of-memory event here."}
    op = tp.native.ooms[k]["op"]
    ops = np.concatenate([tp.program.ops[:op], replay.pack([(replay.ALLOC, OOM_KEY, size, stream)])])
    program = replay.Program(ops, tp.program.prologue, device)
    rows = []
    for name in policies.POLICIES:
        policy = policies.get(name)
        try:
            run = replay.run(program, policy.conf, limit_bytes=capacity, max_samples=16)
        except Exception as err:
            rows.append({"policy": name, "fits": None, "text": f"{name}: the replay failed ({err})"})
            continue
        spare = capacity - run.peak_reserved
        fits = run.failed_allocs == 0
        text = (f"{name} would have fit with {format_bytes(spare)} to spare" if fits else
                f"{name} fails too ({run.failed_allocs} request{'s' if run.failed_allocs != 1 else ''} refused)")
        rows.append({"policy": name, "fits": fits, "failed": run.failed_allocs, "peak_reserved": run.peak_reserved,
                     "spare": spare, "text": text, "description": policy.description})
    note = "" if tp.reproducible else f"The replay's start state is a guess: {tp.start_reason}."
    return {"rows": rows, "note": note, "capacity": capacity}


def oom_reports(snapshot: dict, tl: DeviceTimeline, sites: CallSites, prov: BlockLabels | None = None,
                replay_policies: bool = True) -> list[dict[str, Any]]:
    """One panel's figures per `oom` event of the device."""
    out = []
    for k, (i, size, device_free, stream) in enumerate(tl.ooms[:MAX_PANELS]):
        point = i + 1
        segments, _ = segments_at(snapshot, tl, point)
        runs = free_runs(segments)
        cache_free, largest = sum(runs), max(runs, default=0)
        fragmented, verdict = _verdict(size, device_free, cache_free, largest)
        allocated, reserved = tl.allocated[point], tl.reserved[point]
        panel = {"index": k, "t": tl.times[point], "size": size, "device_free": device_free, "stream": stream,
                 "allocated": allocated, "reserved": reserved, "cache_free": cache_free, "largest_free": largest,
                 "fragmentation": fragmented, "verdict": verdict, "held": held_at(tl, point, sites, prov),
                 "capacity": reserved + device_free}
        if replay_policies and k < MAX_REPLAYED:
            panel["replay"] = _replay_policies(snapshot, tl.device, k, size, stream, reserved + device_free)
        else:
            why = "replay is off" if not replay_policies else f"only the first {MAX_REPLAYED} errors are replayed"
            panel["replay"] = {"rows": [], "note": f"Not replayed: {why}."}
        out.append(panel)
    return out
