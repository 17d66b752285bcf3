"""A test double of the engine's FakeCudaSession (amem_alloc/predict/engine/session.py): the test itself
says which allocations happen, so the surface (shims, analysis, output) is tested on exactly known
sequences. Not an engine: nothing here runs torch code on fake tensors."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Info:
    requested: int
    category: str
    module: str | None = None
    op: str | None = None
    frames: tuple = ()


class DoubleSession:
    last: "DoubleSession | None" = None

    def __init__(self, device_count=1, device_name="NVIDIA H100 80GB HBM3", capability=(9, 0),
                 total_memory=80 * 2**30):
        self.args = dict(device_count=device_count, device_name=device_name, capability=capability,
                         total_memory=total_memory)
        self.listeners, self.entered, self.exited, self.next_key = [], False, False, 0
        DoubleSession.last = self

    def add_listener(self, listener):
        self.listeners.append(listener)

    def marker(self, name):
        for lst in self.listeners:
            lst.on_marker(name)

    def release(self):
        for lst in self.listeners:
            getattr(lst, "on_release", lambda: None)()

    def __enter__(self):
        self.entered = True
        return self

    def __exit__(self, *exc):
        self.exited = True

    # what the test drives
    def alloc(self, size, category="activation", stream=0, module=None, op=None, frames=()):
        self.next_key += 1
        for lst in self.listeners:
            lst.on_alloc(self.next_key, stream, Info(size, category, module, op, frames))
        return self.next_key

    def free(self, key):
        for lst in self.listeners:
            lst.on_free(key)
