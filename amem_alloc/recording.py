"""Recording allocator events: record(), Python stacks, tags, and always-on mode (AMEM_TRACE).

Design note
-----------
The C++ core keeps a bounded ring of events per allocator (csrc/core/trace.h); this module only
switches it on and off and supplies the two small integers each event carries:

* `context` — with stacks="python", a capturer installed through _C.set_stack_capturer runs
  before every allocation (with the GIL) and returns the id of the calling Python stack,
  interned in amem_alloc.stacks. A dump turns ids back into torch-style frame lists
  [{filename, line, name}], innermost first.
* `tag` — a process-wide integer set by `with amem_alloc.tag("forward"):`. Names are interned
  the same way; the dump carries the id -> name table.

What records is a device source (amem_alloc.sources): amem's CUDA allocators, or one Allocator.

Always-on mode (AMEM_TRACE=path, read by amem_alloc.enable(), so also by AMEM_ENABLE=1 and
`amem run`): recording starts when amem is enabled. Under torchrun each rank writes its own
file: `{rank}` in the path is replaced by the rank, and a path without it gets `.rank<N>`
before its suffix (rank_path); the snapshot is written to `path` at
interpreter exit, and to oom_path(path) (".oom" inserted before the suffix) every time a CUDA
allocation runs out of memory, before torch raises — so the trace of the crash is on disk even
if the process then dies without running atexit handlers. AMEM_TRACE_STACKS=python adds stacks;
AMEM_TRACE_ENTRIES=N sizes the ring (default DEFAULT_MAX_ENTRIES).
"""
from __future__ import annotations

import atexit
import contextlib
import os
import sys
import weakref
from pathlib import Path
from typing import Any, Iterator

from . import _C
from .snapshot import dump_snapshot
from .sources import Source, device_source
from .stacks import capture_stack, frames_for, intern_tag, tag_name, tag_names  # noqa: F401 - public here too

DEFAULT_MAX_ENTRIES = 100_000  # events per device ring (64 bytes each: 6.4 MB)
STACK_MODES = (None, "python")


# ---------------------------------------------------------------------------- tags
@contextlib.contextmanager
def tag(name: str) -> Iterator[int]:
    """Marks every allocator event recorded inside the block with `name` (process-wide).

        with amem_alloc.tag("forward"):
            loss = model(x)

    Nests: the previous tag is restored on exit. Yields the tag's id.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"amem: a tag is a non-empty string, got {name!r}")
    ident = intern_tag(name)
    previous = _C.trace_tag()
    _C.set_trace_tag(ident)
    try:
        yield ident
    finally:
        _C.set_trace_tag(previous)


# ---------------------------------------------------------------------------- record()
_state: dict[str, Any] = {"stack_users": set()}  # the source keys that record with stacks


def _check_max_entries(max_entries: Any) -> int:
    if isinstance(max_entries, bool) or not isinstance(max_entries, int):
        raise TypeError(f"amem: max_entries must be an int, got {type(max_entries).__name__}")
    if not 0 < max_entries < 1 << 40:
        raise ValueError(f"amem: max_entries must be between 1 and 2**40, got {max_entries}")
    return max_entries


def _check_stacks(stacks: Any) -> str | None:
    if stacks not in STACK_MODES:
        raise ValueError(f"amem: stacks must be None or 'python', got {stacks!r}")
    return stacks


def _use_stacks(who: Any, stacks: str | None) -> None:
    """The capturer is installed while at least one recorder (CUDA or an Allocator) wants it.

    It is process-wide (the C++ side calls it before every allocation of every allocator), so
    while one recorder asks for stacks, the others' events get them too.
    """
    users = _state["stack_users"]
    (users.add if stacks == "python" else users.discard)(who)
    _C.set_stack_capturer(capture_stack if users else None)


def _recorder_key(source: Source) -> Any:
    if source.owner is not None:  # a dropped Allocator stops asking for stacks
        weakref.finalize(source.owner, _use_stacks, source.key, None)
    return source.key


def record(enabled: bool = True, max_entries: int = DEFAULT_MAX_ENTRIES, stacks: str | None = None,
           allocator: Any = None) -> None:
    """Starts or stops recording allocator events (like torch.cuda.memory._record_memory_history).

    enabled: False stops recording (events already recorded stay until dumped or cleared).
    max_entries: the ring's size per device; when full, the oldest events are overwritten and
        counted as dropped in the dump.
    stacks: None, or "python" to record the Python stack of every allocation.
    allocator: an amem_alloc.Allocator (host/sim backend); None records amem's CUDA allocators
        (every device, present and future). A handle from amem_alloc.sources works too.
    """
    source = device_source(allocator)
    if not enabled:
        stop(source)
        return
    max_entries = _check_max_entries(max_entries)
    _check_stacks(stacks)
    source.start_trace(max_entries)
    _use_stacks(_recorder_key(source), stacks)


def stop(allocator: Any = None) -> None:
    """Stops recording (CUDA, or one Allocator) and its stack capture."""
    source = device_source(allocator)
    source.stop_trace()
    _use_stacks(_recorder_key(source), None)


def is_recording(allocator: Any = None) -> bool:
    """Whether amem's CUDA allocators (or the given Allocator) are recording."""
    return device_source(allocator).recording


# ---------------------------------------------------------------------------- always-on mode
TRACE_ENV = "AMEM_TRACE"
_always_on: dict[str, Any] = {}


def oom_path(path: str | os.PathLike) -> Path:
    """Where an out-of-memory dump goes: trace.pickle -> trace.oom.pickle (trace -> trace.oom)."""
    p = Path(path)
    return p.with_name(f"{p.stem}.oom{p.suffix}") if p.suffix else p.with_name(p.name + ".oom")


def rank_of(env: Any = None) -> int | None:
    """This process's rank under torchrun (RANK), or None outside a multi-process job."""
    env = os.environ if env is None else env
    text = env.get("RANK", "").strip()
    if not text:
        return None
    if not text.isdigit():
        raise ValueError(f"RANK: bad value {text!r}; torchrun sets it to the process's rank (0, 1, ...)")
    return int(text)


def rank_path(path: str, env: Any = None) -> str:
    """AMEM_TRACE for this process: `{rank}` replaced by the rank; under torchrun (RANK set) a path
    without the placeholder gets `.rank<N>` before its suffix, so ranks never write one file."""
    rank = rank_of(env)
    if "{rank}" in path:
        return path.replace("{rank}", str(rank or 0))
    if rank is None:
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}.rank{rank}{p.suffix}") if p.suffix else p.with_name(f"{p.name}.rank{rank}"))


def trace_config_from_env(env: Any = None) -> dict[str, Any] | None:
    """AMEM_TRACE / AMEM_TRACE_STACKS / AMEM_TRACE_ENTRIES as start_always_on() arguments.

    None when AMEM_TRACE is unset or empty; ValueError naming the variable for a bad value. The
    path is this rank's (rank_path): one file per process under torchrun.
    """
    env = os.environ if env is None else env
    path = env.get(TRACE_ENV, "").strip()
    if not path:
        return None
    path = rank_path(path, env)
    stacks = env.get("AMEM_TRACE_STACKS", "").strip() or None
    if stacks not in STACK_MODES:
        raise ValueError(f"AMEM_TRACE_STACKS: bad value {stacks!r}; accepted: 'python' or empty")
    entries_text = env.get("AMEM_TRACE_ENTRIES", "").strip()
    try:
        entries = int(entries_text) if entries_text else DEFAULT_MAX_ENTRIES
        _check_max_entries(entries)
    except (TypeError, ValueError):
        raise ValueError(f"AMEM_TRACE_ENTRIES: bad value {entries_text!r}; accepted: an integer >= 1") from None
    return {"path": path, "stacks": stacks, "max_entries": entries}


def _dump_quietly(path: Path, why: str) -> None:
    try:
        dump_snapshot(path, allocator=_always_on["source"])
    except Exception as err:  # never turn an exit or an OOM into a second failure
        print(f"amem: could not write the trace {why} to {path}: {err}", file=sys.stderr)


def _on_oom(device: int) -> None:
    if _always_on.get("path"):
        _dump_quietly(oom_path(_always_on["path"]), f"at the out-of-memory error on device {device}")


def _at_exit() -> None:
    if _always_on.get("path"):
        _dump_quietly(Path(_always_on["path"]), "at exit")


def start_always_on(path: str | os.PathLike, stacks: str | None = None,
                    max_entries: int = DEFAULT_MAX_ENTRIES, allocator: Any = None) -> None:
    """Records from now on; dumps to `path` at exit and to oom_path(path) on out-of-memory.

    With allocator=None this covers amem's CUDA allocators (what AMEM_TRACE does); an
    Allocator is accepted for tests on a CPU (its OOMs do not call the callback: the CUDA entry
    point does that).
    """
    source = device_source(allocator)
    record(True, max_entries=max_entries, stacks=stacks, allocator=source)
    first = not _always_on
    _always_on.update(path=str(path), source=source, on_oom=_on_oom)
    source.set_oom_callback(_on_oom)
    if first:
        atexit.register(_at_exit)


def stop_always_on() -> None:
    """Stops the exit and out-of-memory dumps (recording itself goes on; see stop())."""
    source = _always_on.get("source")
    if source is not None:
        source.set_oom_callback(None)
    _always_on["path"] = None
    _always_on["source"] = None


def always_on_path() -> str | None:
    """The AMEM_TRACE path in effect, or None."""
    return _always_on.get("path")
