"""Writing a snapshot dict that came from elsewhere (torch's, a copy, one built by hand): a checked copy
is built, then written as amem's own dumps are.

amem's own snapshots are built from its allocators in amem_alloc/snapshot_dump.py, below the runtime
modules that write them (recording, torch_patch, Allocator); they are written without a second check.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..snapshot_dump import write_snapshot
from .load import checked_snapshot


def save_snapshot(data: dict, path: str | os.PathLike) -> Path:
    """Writes a snapshot dict (a checked copy of it) as a protocol-4 pickle, atomically (amem_alloc.atomic_write)."""
    return write_snapshot(checked_snapshot(data, str(path), in_place=False), path)
