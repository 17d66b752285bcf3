"""Python's garbage collector as it frees CUDA memory: a note wherever reference cycles held it.

Design note
-----------
A tensor in a reference cycle (an exception's traceback holding its frames, an object pointing back
at its owner, dynamo's records of a frame it converted) dies when Python's cyclic collector next
runs, not when the program drops it. When that is depends on how many objects the process has made
since the collector last ran, amem's own among them, so a prediction cannot place it where the real
run will: there the memory may be freed earlier or later, and a peak it is part of move by as much.

`CollectorWatch`, one of the session's listeners (run.py), follows the collector through
`gc.callbacks`. A CUDA storage freed inside a
collection Python started by itself is counted; each such collection that freed CUDA memory adds a
NOT_MODELLED note at the allocation site of the largest storage it freed (as the run's recorder
has it), with the bytes that
collection freed (a note's bytes: the most one collection freed there). A collection the program
asks for (`gc.collect()`, before `torch.cuda.empty_cache()` say) frees at a known point: `gc.collect`
is wrapped for the session so that those are told apart and not noted.
"""
from __future__ import annotations

import gc

from ...patching import declare
from ..notes import NOT_MODELLED, Notes, frames_site

GC_COLLECT = declare("gc", "collect", "while a prediction runs: a collection the program asks for is told "
                     "from one Python starts by itself, whose timing a prediction cannot know (engine/collector.py)")

RAN = ("CUDA memory that reference cycles held, freed when Python's garbage collector ran by itself: "
       "when it runs depends on every Python object the process makes (amem's own among them), so in "
       "the real run this memory may be freed earlier or later, and a peak it is part of differ by as much")


class CollectorWatch:
    """The listener that counts the CUDA storages each automatic collection frees, and notes them
    as it ends, from what the run's recorder (run.py's RunRecorder) wrote of each."""

    def __init__(self, notes: Notes, recording) -> None:
        self.notes, self.recording = notes, recording
        self.collect = gc.collect
        self.asked = 0               # > 0 inside a gc.collect() the program (or amem) called
        self.counting = False        # inside a collection Python started by itself
        self.freed: list = []        # AllocInfos of the storages the counted collection freed

    def install(self, patches) -> None:
        gc.callbacks.append(self._phase)
        patches.callback(self._remove)

        def asked_for(*args, **kwargs):
            self.asked += 1
            try:
                return self.collect(*args, **kwargs)
            finally:
                self.asked -= 1
        patches.apply(GC_COLLECT, gc, "collect", asked_for)

    def _remove(self) -> None:
        if self._phase in gc.callbacks:
            gc.callbacks.remove(self._phase)

    def on_alloc(self, key: int, stream: int, info) -> None:
        pass

    def on_free(self, key: int) -> None:
        info = self.recording.infos.get(key) if self.counting else None
        if info is not None:
            self.freed.append(info)

    def on_marker(self, name: str) -> None:
        pass

    def _phase(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.counting, self.freed = self.asked == 0, []
            return
        freed, self.counting, self.freed = self.freed, False, []
        if freed:
            largest = max(freed, key=lambda info: info.requested)
            self.notes.add(NOT_MODELLED, RAN, frames_site(largest.frames), sum(info.requested for info in freed))


CALLBACK_CODES = frozenset({CollectorWatch._phase.__code__})   # gc.callbacks: Python drops their exceptions
