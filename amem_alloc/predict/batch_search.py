"""Scripts that choose their batch by running out of memory, said where the figures are.

Design note
-----------
A prediction never runs out of memory: it records what the run asks for, whatever the card holds.
A script that catches torch's out-of-memory error and tries again with a smaller batch
(accelerate's `find_executable_batch_size`, which HF Trainer's `auto_find_batch_size` uses) is
therefore predicted at the batch it starts with, and a batch-size finder that grows the batch
until memory runs out (Lightning's `Tuner.scale_batch_size`) never sees it run out, so it ends at
its largest trial. Neither is modelled. At each optimizer step the stack is searched for the
frames of the known searches (`SEARCHES`); the first found is noted once (not modelled), with the
batch it holds and the user's line that called it, and what to do instead: find the batch that
fits (`amem fit`) and predict that.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from . import notes


@dataclass(frozen=True)
class Search:
    path: str          # the file's path's end, as its package installs it
    function: str      # the frame's function
    name: str          # what the note calls it
    batch: str         # the frame's local holding the batch it tries (said where it shrinks)
    grows: bool        # grows the batch until memory runs out (else shrinks it when it does)


SEARCHES = (
    Search("accelerate/utils/memory.py", "decorator", "accelerate's find_executable_batch_size", "batch_size", False),
    *(Search(f"{package}/tuner/batch_size_scaling.py", function, "Lightning's batch size finder", "new_size", True)
      for package in ("lightning/pytorch", "pytorch_lightning")
      for function in ("_run_power_scaling", "_run_binsearch_scaling")),
)

NEVER_RUNS_OUT = "but a prediction never runs out"
SHRINKS = ("{name} retries with a smaller batch when memory runs out, " + NEVER_RUNS_OUT + ": the figures are for the "
           "batch it started with{batch}; where that does not fit, the real run goes on at the first smaller batch that "
           "does (where the batch is an argument of the script, amem fit finds the largest that fits; predict that one)")
GROWING = "grows the batch until memory runs out"
GROWS = ("{name} " + GROWING + ", " + NEVER_RUNS_OUT + ": its trials all pass, it settles on its "
         "largest whatever the card, and the figures are for that batch; fix the batch (where it is an argument of the "
         "script, amem fit finds the largest that fits) and predict that")
LOOKS_UP = 64   # frames searched above the step


def note_if_inside() -> None:
    """Notes (once) the first known batch search on the stack, if any."""
    frame = sys._getframe(1)
    for _ in range(LOOKS_UP):
        if frame is None:
            return
        search = _search_of(frame.f_code)
        if search is not None:
            _note(search, frame)
            return
        frame = frame.f_back


def _search_of(code) -> Search | None:
    name = code.co_filename.replace("\\", "/")
    return next((s for s in SEARCHES if code.co_name == s.function and name.endswith(s.path)), None)


def _note(search: Search, frame) -> None:
    batch = frame.f_locals.get(search.batch) if not search.grows else None   # (a finder's changes each trial)
    text = (GROWS if search.grows else SHRINKS).format(
        name=search.name, batch=f", {batch}" if isinstance(batch, int) and not isinstance(batch, bool) else "")
    where = notes.frame_site(frame)
    held = notes.current()
    if held is not None and not any(n.kind == notes.NOT_MODELLED and n.what == text for n in held):
        notes.record(notes.NOT_MODELLED, text, where=where)


def said(shown: list[dict]) -> dict | None:
    """The note of a batch search among a prediction's notes (as shown: dicts), for the verdict;
    "grows": a finder's (its batch is its largest trial, fitting or not)."""
    return next(({"what": n["what"], "where": n["where"], "grows": GROWING in n["what"]} for n in shown or ()
                 if n.get("kind") == notes.NOT_MODELLED and NEVER_RUNS_OUT in n.get("what", "")), None)
