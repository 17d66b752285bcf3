"""record_stream under prediction: a storage used on another stream is freed only once that stream
is known to be done with it.

Design note
-----------
torch's caching allocator (c10/cuda/CUDACachingAllocator.cpp, `recordStream` / `insert_events` /
`process_events`): `tensor.record_stream(s)` adds `s` to the block's stream uses; when the tensor
dies, the allocator records an event on each of those streams and the block goes back to its pool
only when every event has completed (checked at later mallocs). Until then the block is allocated
(`active_pending_free` in a snapshot) and nothing can reuse it.

Prediction computes nothing, so it has no GPU clock to say when an event completes. The rule here
is the earliest point the *program* can observe it: a deferred free completes when the stream it
waits for is synchronised with — another stream waits for it (`wait_stream`, or `wait_event` of an
event recorded on it), or it or the device is synchronised (`synchronize`) — or when the prediction
ends. A GPU runs behind the CPU, so a real block usually comes back no earlier than that; it can
come back later (the allocator sees the event only at its next malloc after the GPU passed it).

Events mark a point in the program: each held free has its place in the order of frees, and an
event remembers the place it was recorded at (`position`). Waiting for an event (`wait_event`)
completes only the frees held before it, for its stream. A CPU that blocks on an event
(`Event.synchronize`: FSDP1's `limit_all_gathers` rate limiter) completes the frees held before it
for every stream: the device has reached that point, and the work queued on other streams before
it (a reduce-scatter whose input waits for it) is taken as done — an assumption, not something
the program observes; without it FSDP1's unsharded gradients, each freed for the post-backward
stream and never waited for before the end of backward, would all be held at once.

The collectives of amem_alloc/predict/distributed use the same mechanism for ProcessGroupNCCL's
`recordStream` on the tensors handed to NCCL. Their streams are *tracked*: every launch on them is
reported (`launched`), so the program knows when such a stream has nothing queued. A storage used
on a tracked stream that was synchronised with since, and has had nothing launched on it after,
is freed at once (the allocator's event, recorded at the free, would complete immediately); one
launch after the sync and the free waits for the next sync again. A script's own side streams
are not tracked (their kernels are not seen as launches): a use of one lasts until a sync after
the free, the conservative side.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from ...patching import declare
from .. import state



class StreamUses:
    """Stream uses per storage key, and the frees they hold back."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.free_now = session.storages.on_free           # the session's own free (records it)
        self.alloc_stream: dict[int, int] = {}             # key -> stream it was allocated on
        self.uses: dict[int, set[int]] = defaultdict(set)  # key -> other streams that used it
        self.held: dict[int, set[int]] = {}                # key -> streams its free still waits for
        self.over: dict[int, set[int]] = defaultdict(set)  # key -> tracked streams synchronised since its use
        self.tracked: set[int] = set()                     # streams whose launches are reported
        self.queued: set[int] = set()                      # tracked streams with work since their last sync
        self.place: dict[int, int] = {}                    # key -> its free's place in the order of frees
        self.position = 0                                  # how many frees have been held so far

    # ---------------------------------------------------------------- what torch tells
    def allocated(self, key: int, stream: int) -> None:
        self.alloc_stream[key] = stream

    def record(self, key: int | None, stream: int) -> None:
        """record_stream(stream) on the storage `key` (None: not a CUDA storage of the session)."""
        if key is not None and stream != self.alloc_stream.get(key, stream):
            self.uses[key].add(stream)

    def launched(self, stream: int) -> None:
        """Work was queued on the tracked `stream` (a collective on an NCCL stream)."""
        self.tracked.add(stream)
        self.queued.add(stream)

    def free(self, key: int) -> None:
        """The storage died: freed now, or held until its streams are synchronised with."""
        waits = self.uses.pop(key, set()) | (self.over.pop(key, set()) & self.queued)
        self.alloc_stream.pop(key, None)
        if waits:
            self.position += 1
            self.held[key], self.place[key] = set(waits), self.position
        else:
            self.free_now(key)

    def synchronised(self, stream: int | None, before: int | None = None) -> None:
        """Work queued on `stream` (None: every stream) is known done, up to the free at place
        `before` (None: up to now): frees waiting for it complete; up to now, live storages' uses
        of tracked streams are over too, unless more is launched there."""
        if before is None:
            self._uses_over(self.tracked if stream is None else {stream} & self.tracked)
        for key in [k for k, waits in self.held.items() if (stream is None or stream in waits)
                    and (before is None or self.place[k] <= before)]:
            waits = self.held[key]
            waits.discard(stream) if stream is not None else waits.clear()
            if not waits:
                del self.held[key], self.place[key]
                self.free_now(key)

    def _uses_over(self, done: set[int]) -> None:
        self.queued -= done
        for key in [k for k, uses in self.uses.items() if uses & done]:
            self.over[key] |= self.uses[key] & done
            self.uses[key] -= done
            if not self.uses[key]:
                del self.uses[key]

    def pending(self) -> int:
        return len(self.held)


# ============================================================================ install
RECORD_STREAM = declare("torch.Tensor", "record_stream",
                        "a fake tensor's record_stream holds its storage's free for that stream (stream_uses.py)")


def install(session: Any) -> StreamUses:
    """Routes the session's frees through a StreamUses and patches Tensor.record_stream (through
    the session's PatchSet: undone with its other patches). Returns it; `finish` completes what is
    still held."""
    import torch

    from .values import is_fake

    uses = StreamUses(session)
    session.storages.on_free = uses.free
    session.add_listener(_AllocStreams(uses))
    original = torch.Tensor.record_stream

    def record_stream(tensor: Any, stream: Any) -> None:
        if is_fake(tensor) or getattr(stream, "stream_id", None) is not None:
            uses.record(session.storages.key_of(tensor), int(getattr(stream, "stream_id", 0)))
            return
        return original(tensor, stream)

    session.patches.apply(RECORD_STREAM, torch.Tensor, "record_stream", record_stream)
    session.state.stream_uses = uses
    return uses


def finish(uses: StreamUses) -> None:
    """The prediction ends: the device is idle, every held free completes."""
    uses.synchronised(None)


def _every() -> list[StreamUses]:
    return [st.stream_uses for st in state.active_states() if st.stream_uses is not None]


def synchronised(stream: int | None, before: int | None = None) -> None:
    """Called by torch.cuda's stand-ins (shims/) when a stream (None: the device) is waited for,
    up to an event's `position` (None: up to now)."""
    for uses in _every():
        uses.synchronised(stream, before)


def position() -> int | None:
    """The running session's place in the order of held frees (an event recorded now keeps it)."""
    uses = current()
    return uses.position if uses is not None else None


def record(tensor: Any, stream: int) -> None:
    """record_stream from inside amem (the collectives' NCCL stream), on the running session."""
    for uses in _every():
        uses.record(uses.session.storages.key_of(tensor), stream)


def launched(stream: int) -> None:
    """A collective was queued on the (tracked) NCCL `stream`, on the running session."""
    for uses in _every():
        uses.launched(stream)


def current() -> StreamUses | None:
    st = state.current()
    return st.stream_uses if st is not None else None


class _AllocStreams:
    """Listener: the stream each storage was allocated on."""

    def __init__(self, uses: StreamUses) -> None:
        self.uses = uses

    def on_alloc(self, key: int, stream: int, info: Any) -> None:
        self.uses.allocated(key, stream)

    def on_free(self, key: int) -> None: ...
    def on_marker(self, name: str) -> None: ...
