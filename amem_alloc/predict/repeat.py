"""Steps that repeat: a training loop's later steps written out from its last one instead of run.

Design note
-----------
A training script's steps settle after the first few (the optimizer's state exists from the
first), and from then on each step asks the allocator for the same sequence. Running such a step
on fake tensors costs as much as the first; its program can be written out instead, exactly:

* A step is the ops between two "step" markers (run.py). Two steps are *the same* when they have
  the same ops in the same order — each alloc the same size on the same stream, each free of the
  block allocated at the same position the same number of steps back (up to REACH: a loss kept
  until the next step's end is freed two steps after it was made, as step boundaries fall at
  optimizer.step), each pool op and release the same — and no free reaches further back (a
  persistent block freed makes steps differ).
* When the last two steps run are the same (and at least `MIN_RUN` steps ran), the script is
  stopped there (script.py) and `extend` appends copies of the last step, each with fresh keys,
  its frees of earlier steps' blocks remapped to the copies before it, each copy's allocations
  described as the step's were; a "step" marker after each. The allocator replays all of them, so its cache
  evolves over the steps as it would have.

The output says which steps were written out (notes and the stopped-after line).

Steps that grow (a decode loop, decode_loop.py): each step of a KV-cache decode loop makes the same
allocations in the same order, but those sized by the context (the cache's keys and values, a mask)
grow by the same bytes every step, as the cache gains a token. `growth` says, for the last `GROW_RUN`
steps of one shape, by how many bytes each allocation grew from step to step, when that difference
is the same for every pair of steps (an affine size in the step index, as a tensor's bytes are in
one of its dimensions); `extend_at(..., growth)` then writes copy j with each size grown j times.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from .. import replay

MIN_RUN = 3          # steps run before a repeat may be taken: the first step creates optimizer state
REACH = 4            # how many steps back a step's frees may reach (a loss kept until the next step's end)
GROW_RUN = 4         # steps of one shape whose sizes must grow alike before growth is extrapolated
STEP = "step"


def step_spans(markers: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """(start, end) op indices of each step: from the previous step marker (or 0) to this one."""
    ends = [i for i, name in markers if name == STEP]
    return list(zip([0, *ends[:-1]], ends))


def _shape(ops: list[tuple], spans: list[tuple[int, int]], k: int) -> list[tuple] | None:
    """Step k's ops with keys replaced by where they were allocated (how many steps back, which
    allocation of that step); None if a free reaches further back than REACH steps."""
    made = [_positions(ops, spans[k - d]) for d in range(min(REACH, k) + 1)]
    out = []
    for kind, key, size, stream in ops[spans[k][0]:spans[k][1]]:
        if kind == replay.ALLOC:
            out.append((kind, size, stream))
        elif kind == replay.FREE:
            back = next((d for d, keys in enumerate(made) if key in keys), None)
            if back is None:
                return None
            out.append((kind, back, made[back][key]))
        else:
            out.append((kind, key))
    return out


def _positions(ops: list[tuple], span: tuple[int, int]) -> dict[int, int]:
    """key -> its allocation's index among the span's allocations."""
    out: dict[int, int] = {}
    for kind, key, _, _ in ops[span[0]:span[1]]:
        if kind == replay.ALLOC:
            out[key] = len(out)
    return out


def last_steps_repeat(ops: list[tuple], markers: list[tuple[int, str]]) -> bool:
    """Whether the last two steps run are the same (and at least MIN_RUN ran)."""
    spans = step_spans(markers)
    if len(spans) < MIN_RUN:
        return False
    a = _shape(ops, spans, len(spans) - 2)
    return a is not None and a == _shape(ops, spans, len(spans) - 1)


def growth(ops: list[tuple], spans: list[tuple[int, int]], run: int = GROW_RUN) -> list[int] | None:
    """Per allocation of the last step, the bytes it grew by at each of the last `run` steps, when
    those steps have the same ops but for sizes (as _shape says, keys by position) and every
    allocation grew by the same bytes from each step to the next (0 for a constant size); else None."""
    if len(spans) < max(run, MIN_RUN):
        return None
    shapes = [_shape(ops, spans, k) for k in range(len(spans) - run, len(spans))]
    if any(s is None for s in shapes):
        return None
    forms = [[op if op[0] != replay.ALLOC else (op[0], op[2]) for op in s] for s in shapes]
    if any(f != forms[0] for f in forms[1:]):
        return None
    sizes = [[op[1] for op in s if op[0] == replay.ALLOC] for s in shapes]
    steps = [[b - a for a, b in zip(x, y)] for x, y in zip(sizes, sizes[1:])]
    return steps[0] if all(d == steps[0] for d in steps[1:]) else None


def extend(run: Any, copies: int) -> Any:
    """The RecordedRun with `copies` more steps after its last, each the last step's ops with fresh
    keys; what came after the last step (the frees of the script's end) comes after the copies,
    freeing the latest copies' blocks where it freed the last steps'."""
    if copies <= 0:
        return run
    return extend_at(run, step_spans(run.markers), copies)


def extend_at(run: Any, spans: list[tuple[int, int]], copies: int, grow: list[int] | None = None,
              marker: str | None = STEP, grow_after: bool = False) -> Any:
    """extend() for the steps `spans` (op indices; the last one is copied): `copies` copies of it
    after it, copy j with each allocation `grow[i] * j` bytes larger (grow: growth()), a `marker`
    after each (None: none); the ops after the last span (the rest of the run) follow, with their
    frees of the last steps' blocks moved to the copies'. grow_after: the rest begins with a step
    cut short (its first ops, as far as they are the step's), whose allocations grow as the copies'
    do. Markers after the last span move with their ops."""
    if copies <= 0:
        return run
    last = spans[-1]
    steps = [_alloc_keys(run.ops, span) for span in spans]   # each step's allocations' keys, in order
    shape = _shape(run.ops, spans, len(spans) - 1)
    sources = _alloc_keys(run.ops, last)
    infos, autocast = dict(run.infos), set(run.autocast_keys)
    ops, markers = list(run.ops[:last[1]]), [m for m in run.markers if m[0] <= last[1]]
    next_key = max(infos, default=0) + 1
    for j in range(1, copies + 1):
        keys = list(range(next_key, next_key + len(sources)))
        next_key += len(sources)
        for key, source in zip(keys, sources):
            infos[key] = run.infos[source]
            if source in run.autocast_keys:
                autocast.add(key)
        steps.append(keys)
        ops += _written(shape, run.ops[last[0]:last[1]], steps, [g * j for g in grow] if grow else None)
        if marker is not None:
            markers.append((len(ops), marker))
    rest = run.ops[last[1]:]
    if grow_after and grow:
        rest = _grown_start(rest, run.ops[last[0]:last[1]], grow, copies)
    ops += _tail(rest, steps, len(spans))
    shift = len(ops) - len(run.ops)
    markers += [(i + shift, name) for i, name in run.markers if i > last[1]]
    return dataclasses.replace(run, ops=ops, infos=infos, markers=markers, autocast_keys=frozenset(autocast))


def _written(shape: list[tuple], step: list[tuple], steps: list[list[int]], grown: list[int] | None = None) -> list[tuple]:
    """One copy of the step: its shape with keys from the copy (steps[-1]) and the steps before it,
    each allocation `grown[i]` bytes larger."""
    out, made = [], 0
    for (kind, key, size, stream), form in zip(step, shape):
        if kind == replay.ALLOC:
            out.append((kind, steps[-1][made], size + grown[made] if grown and grown[made] else size, stream))
            made += 1
        elif kind == replay.FREE:
            _, back, index = form
            out.append((kind, steps[-1 - back][index], 0, 0))
        else:
            out.append((kind, key, size, stream))
    return out


def _grown_start(rest: list[tuple], step: list[tuple], grow: list[int], copies: int) -> list[tuple]:
    """`rest` with its first ops, as long as they are the next step's (the step's ops, each allocation
    grown once), grown by `copies` steps more: the step cut short comes after the copies."""
    out, made = list(rest), 0
    for i, ((kind, _, size, stream), (rkind, rkey, rsize, rstream)) in enumerate(zip(step, rest)):
        if kind != rkind:
            break
        if kind == replay.ALLOC:
            if (rsize, rstream) != (size + grow[made], stream):
                break
            out[i] = (rkind, rkey, rsize + copies * grow[made], rstream)
            made += 1
    return out


def _tail(tail: list[tuple], steps: list[list[int]], run_steps: int) -> list[tuple]:
    """The ops after the last step, its frees of the last REACH steps' blocks moved to the copies'."""
    where = {key: (back, index) for back in range(min(REACH, run_steps))
             for index, key in enumerate(steps[run_steps - 1 - back])}
    out = []
    for kind, key, size, stream in tail:
        if kind == replay.FREE and key in where:
            back, index = where[key]
            key = steps[-1 - back][index]
        out.append((kind, key, size, stream))
    return out


def _alloc_keys(ops: list[tuple], span: tuple[int, int]) -> list[int]:
    return [key for kind, key, _, _ in ops[span[0]:span[1]] if kind == replay.ALLOC]
