"""Streams for workloads that run on a GPU or on the CPU.

On CUDA a `Stream` is a real torch.cuda.Stream (or the current stream, for the compute stream):
`use()` makes it current, `wait(other)` is torch's wait_stream, `keep(tensor)` is record_stream,
the calls FSDP makes. The CPU has no streams, so there a stream is a number: `use()` notes each
switch in SWITCHES as (time.time_ns(), stream), which is all a CPU recorder needs to give each
allocation the stream that was current when it was made (`stream_at`); wait and keep do nothing,
because CPU work runs in order. The workload's code is the same on both.
"""
from __future__ import annotations

import bisect
import threading
import time
from contextlib import contextmanager
from typing import Iterator

SWITCHES: list[tuple[int, int]] = []  # (time ns, stream now current), CPU only; starts on stream 0
_current = threading.local()


def _cpu_stream() -> int:
    return getattr(_current, "stream", 0)


def _note(stream: int) -> None:
    _current.stream = stream
    SWITCHES.append((time.time_ns(), stream))


class Stream:
    """Stream `ident` of `device` (0: the current stream; any other number: a new side stream)."""

    def __init__(self, device, ident: int = 0) -> None:
        import torch

        self.device = torch.device(device)
        self.ident = ident
        self.cuda = self.device.type == "cuda"
        self.handle = None
        if self.cuda:
            self.handle = torch.cuda.current_stream(self.device) if ident == 0 else torch.cuda.Stream(self.device)

    @contextmanager
    def use(self) -> Iterator["Stream"]:
        if self.cuda:
            import torch

            with torch.cuda.stream(self.handle):
                yield self
            return
        before = _cpu_stream()
        _note(self.ident)
        try:
            yield self
        finally:
            _note(before)

    def wait(self, other: "Stream") -> None:
        """Work queued on this stream from now on waits for what `other` has queued so far."""
        if self.cuda:
            self.handle.wait_stream(other.handle)

    def keep(self, tensor) -> None:
        """`tensor` (allocated on another stream) is used on this one: its memory must not be
        reused before this stream's queued work is done (record_stream)."""
        if self.cuda:
            tensor.record_stream(self.handle)


def stream_at(switches: list[tuple[int, int]], t_ns: int) -> int:
    """The CPU stream current at time t_ns, from a SWITCHES log (0 before the first switch)."""
    i = bisect.bisect_right(switches, (t_ns, float("inf"))) - 1
    return switches[i][1] if i >= 0 else 0
