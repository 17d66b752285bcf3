"""The table of storages a tracer has seen: live ones by storage key, freed ones in a bounded history.

A storage key is (device, data_ptr). A pointer is reused once its storage dies, so every entry
holds a weak reference to the storage object itself (torch keeps one Python object per live
storage): a lookup matches only the very same storage, and the reference's callback records the
free (sequence number and time) the moment the storage dies and moves the record to the history.
"""
from __future__ import annotations

import collections
import weakref

from .records import next_seq, now_ns


class _Watch(weakref.ref):
    """A weak reference to a storage that knows its record and its table."""

    __slots__ = ("record", "table")


def _on_free(watch: _Watch) -> None:
    rec, table = watch.record, watch.table
    rec.freed_seq, rec.freed_ns = next_seq(), now_ns()
    if table.live.get(rec.key) is watch:
        del table.live[rec.key]
    table.freed.append(rec)


class AllocationTable:
    def __init__(self, history: int):
        self.live: dict = {}                                  # key -> _Watch
        self.freed = collections.deque(maxlen=history or None)  # freed AllocRecords, oldest first
        self.count = 0                                        # records ever added

    def add(self, storage, rec) -> None:
        watch = _Watch(storage, _on_free)
        watch.record, watch.table = rec, self
        self.live[rec.key] = watch
        self.count += 1

    def find(self, key, storage):
        """The live record of this very storage, or None."""
        watch = self.live.get(key)
        return watch.record if watch is not None and watch() is storage else None

    def records(self, live_only: bool = False) -> list:
        live = [w.record for w in list(self.live.values())]
        out = live if live_only else list(self.freed) + live
        return sorted(out, key=lambda r: r.seq)
