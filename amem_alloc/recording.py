"""Recording allocator events: record(), Python stacks, tags, and always-on mode (AMEM_TRACE).

Design note
-----------
The C++ core keeps a bounded ring of events per allocator (csrc/core/trace.h); this module only
switches it on and off and supplies the two small integers each event carries:

* `context` — with stacks="python", a capturer installed through _C.set_stack_capturer runs
  before every allocation (with the GIL) and returns the id of the calling Python stack. Stacks
  are interned: identical stacks share one id, so a training loop that allocates from the same
  few lines costs a dict lookup per allocation, not a new list. Frames inside the amem_alloc
  package are left out. A dump turns ids back into torch-style frame lists
  [{filename, line, name}], innermost first.
* `tag` — a process-wide integer set by `with amem_alloc.tag("forward"):`. Names are interned
  the same way; the dump carries the id -> name table.

Always-on mode (AMEM_TRACE=path, read by amem_alloc.enable(), so also by AMEM_ENABLE=1 and
`amem run`): recording starts when amem is enabled; the snapshot is written to `path` at
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
import threading
import weakref
from pathlib import Path
from typing import Any, Iterator

from . import _C

DEFAULT_MAX_ENTRIES = 100_000  # events per device ring (64 bytes each: 6.4 MB)
STACK_MODES = (None, "python")
_PACKAGE_DIR = str(Path(__file__).resolve().parent) + os.sep

Frame = tuple  # (filename, line, name)


# ---------------------------------------------------------------------------- interning tables
class _InternTable:
    """Values <-> small positive ids (0 means none). Thread-safe; ids are never reused."""

    def __init__(self) -> None:
        self._ids: dict[Any, int] = {}
        self._values: list[Any] = [None]
        self._lock = threading.Lock()

    def intern(self, value: Any) -> int:
        found = self._ids.get(value)
        if found is not None:
            return found
        with self._lock:
            found = self._ids.get(value)
            if found is None:
                found = len(self._values)
                self._values.append(value)
                self._ids[value] = found
            return found

    def get(self, ident: int) -> Any:
        return self._values[ident] if 0 < ident < len(self._values) else None

    def items(self) -> list[tuple[int, Any]]:
        return [(i, v) for i, v in enumerate(self._values) if i > 0]


_stacks = _InternTable()  # tuple of (filename, line, name), innermost first
_tags = _InternTable()  # tag names


def _python_stack() -> tuple[Frame, ...]:
    frame = sys._getframe(1)  # traceback.extract_stack() without reading source lines
    frames = []
    while frame is not None:
        code = frame.f_code
        if not code.co_filename.startswith(_PACKAGE_DIR):
            frames.append((code.co_filename, frame.f_lineno, code.co_name))
        frame = frame.f_back
    return tuple(frames)


def capture_stack() -> int:
    """The id of the calling Python stack (the stack capturer the C++ side calls)."""
    return _stacks.intern(_python_stack())


def frames_for(context: int) -> list[dict]:
    """Torch-style frames for a context id, innermost first; [] for 0 or an unknown id."""
    stack = _stacks.get(int(context)) or ()
    return [{"filename": f, "line": line, "name": name} for f, line, name in stack]


def tag_name(ident: int) -> str | None:
    return _tags.get(int(ident))


def tag_names() -> dict[int, str]:
    """Every tag id seen in this process -> its name."""
    return dict(_tags.items())


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
    ident = _tags.intern(name)
    previous = _C.trace_tag()
    _C.set_trace_tag(ident)
    try:
        yield ident
    finally:
        _C.set_trace_tag(previous)


# ---------------------------------------------------------------------------- record()
_state: dict[str, Any] = {"cuda": False, "stack_users": set()}  # who records with stacks


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


def _recorder_key(allocator: Any) -> Any:
    if allocator is None:
        return "cuda"
    key = id(allocator._core)
    weakref.finalize(allocator, _use_stacks, key, None)  # a dropped Allocator stops asking for stacks
    return key


def record(enabled: bool = True, max_entries: int = DEFAULT_MAX_ENTRIES, stacks: str | None = None,
           allocator: Any = None) -> None:
    """Starts or stops recording allocator events (like torch.cuda.memory._record_memory_history).

    enabled: False stops recording (events already recorded stay until dumped or cleared).
    max_entries: the ring's size per device; when full, the oldest events are overwritten and
        counted as dropped in the dump.
    stacks: None, or "python" to record the Python stack of every allocation.
    allocator: an amem_alloc.Allocator (host/sim backend); None records amem's CUDA allocators
        (every device, present and future).
    """
    if not enabled:
        stop(allocator)
        return
    max_entries = _check_max_entries(max_entries)
    _check_stacks(stacks)
    if allocator is None:
        _C.cuda_record(max_entries)
        _state["cuda"] = True
    else:
        allocator._core.start_trace(max_entries)
    _use_stacks(_recorder_key(allocator), stacks)


def stop(allocator: Any = None) -> None:
    """Stops recording (CUDA, or one Allocator) and its stack capture."""
    if allocator is None:
        _C.cuda_record(0)
        _state["cuda"] = False
    else:
        allocator._core.stop_trace()
    _use_stacks(_recorder_key(allocator), None)


def is_recording(allocator: Any = None) -> bool:
    """Whether amem's CUDA allocators (or the given Allocator) are recording."""
    return bool(allocator._core.tracing) if allocator is not None else bool(_state["cuda"])


# ---------------------------------------------------------------------------- always-on mode
TRACE_ENV = "AMEM_TRACE"
_always_on: dict[str, Any] = {}


def oom_path(path: str | os.PathLike) -> Path:
    """Where an out-of-memory dump goes: trace.pickle -> trace.oom.pickle (trace -> trace.oom)."""
    p = Path(path)
    return p.with_name(f"{p.stem}.oom{p.suffix}") if p.suffix else p.with_name(p.name + ".oom")


def trace_config_from_env(env: Any = None) -> dict[str, Any] | None:
    """AMEM_TRACE / AMEM_TRACE_STACKS / AMEM_TRACE_ENTRIES as start_always_on() arguments.

    None when AMEM_TRACE is unset or empty; ValueError naming the variable for a bad value.
    """
    env = os.environ if env is None else env
    path = env.get(TRACE_ENV, "").strip()
    if not path:
        return None
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
    from .snapshot import dump_snapshot

    try:
        dump_snapshot(path, allocator=_always_on.get("allocator"))
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
    record(True, max_entries=max_entries, stacks=stacks, allocator=allocator)
    first = not _always_on
    _always_on.update(path=str(path), allocator=allocator, on_oom=_on_oom)
    if allocator is None:
        _C.set_oom_callback(_on_oom)
    if first:
        atexit.register(_at_exit)


def stop_always_on() -> None:
    """Stops the exit and out-of-memory dumps (recording itself goes on; see stop())."""
    if _always_on.get("allocator") is None:
        _C.set_oom_callback(None)
    _always_on["path"] = None
    _always_on["allocator"] = None


def always_on_path() -> str | None:
    """The AMEM_TRACE path in effect, or None."""
    return _always_on.get("path")
