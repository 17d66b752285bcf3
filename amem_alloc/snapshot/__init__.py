"""Snapshots in PyTorch's format: build one from amem's allocators, dump it, load one safely.

Design note
-----------
A snapshot is the dict torch.cuda.memory._snapshot() returns, so torch's own tools
(`python -m torch.cuda._memory_viz stats|trace|segments|memory|trace_plot|segment_plot` and the
web viewer) read ours, and ours read theirs:

    {"segments": [{device, address, total_size, allocated_size, active_size, requested_size,
                   stream, segment_type, segment_pool_id, is_expandable, frames,
                   blocks: [{address, size, requested_size, state, frames}]}],
     "device_traces": [[{action, addr | device_free, size, stream, time_us, frames,
                         compile_context, user_metadata}, ...] per device],
     "allocator_settings": {...},
     "amem": {...}}                      # amem's extras; torch's tools never look at it

Trace entries hold exactly torch's keys. What torch has no key for lives under "amem"
(FORMAT_VERSION): per device the ring's recorded/dropped counts, the allocator's stats, one
column per extra field aligned with device_traces[d] (seq, rounded_size, thread, tag, context,
alloc_seq), and the `empty_cache` events, which torch's trace has no action for. The tag table
maps tag ids to names (each entry's user_metadata also carries its tag's name). With these,
amem_events() gives back amem's own events exactly (ours -> dump -> load -> ours).

The package is split by job: load.py (reading a file safely and checking every field; the
caller's dict is never changed), build.py (a dict from elsewhere, checked, written to disk),
frames.py (reading and formatting stack frames) and format.py (the readers' constants,
SnapshotError, and reading amem's own events back). Building amem's own snapshot from its
allocators, and the layout it writes, live one tier down in amem_alloc/snapshot_dump.py: the
runtime modules write snapshots themselves (recording's AMEM_TRACE dumps, torch_patch's
torch.cuda.memory._snapshot) and import nothing above them (docs/architecture.md). Every public
name is importable from amem_alloc.snapshot.

Loading is bounded (load.py's note): regular files or standard input up to a size cap, the
pickle's opcodes scanned in C++ before unpickling, every class lookup refused, every field
checked, each segment, block and event listed once. Anything wrong — an unreadable file, a
truncated or hostile pickle, a wrong type, a missing key, an unknown amem format version —
raises SnapshotError naming the file, the problem and the limit; nothing else escapes.
"""
from __future__ import annotations

from ..snapshot_dump import EXTRA_COLUMNS, FORMAT_VERSION, PICKLE_PROTOCOL, build_snapshot, dump_snapshot
from .build import save_snapshot
from .format import (BLOCK_STATES, MAX_FILE_BYTES, TORCH_ACTIONS, SnapshotError, amem_events, device_extra, round_block,
                     tag_table)
from .frames import format_frames, frame_fields
from .load import load_snapshot, max_trace_bytes, parse_snapshot, read_trace_bytes, set_max_trace_bytes

__all__ = ["BLOCK_STATES", "EXTRA_COLUMNS", "FORMAT_VERSION", "MAX_FILE_BYTES", "PICKLE_PROTOCOL", "TORCH_ACTIONS",
           "SnapshotError", "amem_events", "build_snapshot", "device_extra", "dump_snapshot", "format_frames",
           "frame_fields", "load_snapshot", "max_trace_bytes", "parse_snapshot", "read_trace_bytes", "round_block", "save_snapshot", "set_max_trace_bytes", "tag_table"]
