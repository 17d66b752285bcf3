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

How jobs end (torchrun, Slurm and Kubernetes stop a job with SIGTERM, then SIGKILL): SIGTERM,
whose default kills the process without atexit, gets a handler that dumps the trace, then ends
the process with SIGTERM's own status (the default disposition restored and the signal raised
again), or hands over to a handler installed before amem's. SIGINT keeps Python's
KeyboardInterrupt, which unwinds through atexit (the dump) and exits by SIGINT; a handler of the
user's own is chained the same way as for SIGTERM. SIGKILL and os._exit run nothing, so
AMEM_TRACE_FLUSH=SECONDS adds a background thread that rewrites the trace every SECONDS when
the allocators have changed since the last write. Every write is atomic (amem_alloc.atomic_write):
a kill mid-dump leaves the previous trace whole, the file always loadable. Only the process that
started recording dumps: a forked child (a DataLoader worker, stopped with SIGTERM) inherits the
handlers and a stale copy of the allocators, and must not overwrite its parent's trace.
"""
from __future__ import annotations

import atexit
import contextlib
import math
import os
import signal
import sys
import threading
import weakref
from pathlib import Path
from typing import Any, Iterator

from . import _C
from .snapshot_dump import dump_snapshot
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


def _flush_seconds(text: str) -> float | None:
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not math.isfinite(seconds) or not 0 < seconds < 1e6:
        raise ValueError(f"AMEM_TRACE_FLUSH: bad value {text!r}; accepted: seconds between writes of the trace, "
                         "a number > 0 (e.g. 60), or empty for none")
    return seconds


def trace_config_from_env(env: Any = None) -> dict[str, Any] | None:
    """AMEM_TRACE / _STACKS / _ENTRIES / _FLUSH as start_always_on() arguments.

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
    flush = _flush_seconds(env.get("AMEM_TRACE_FLUSH", "").strip())
    return {"path": path, "stacks": stacks, "max_entries": entries, "flush_seconds": flush}


def _dump_quietly(path: Path, why: str) -> None:
    if _always_on.get("pid") != os.getpid():  # a forked child (a DataLoader worker) holds a stale copy:
        return                                # its exit or SIGTERM must not overwrite the parent's trace
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


# ---------------------------------------------------------------------------- how jobs end
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _on_stop_signal(signum: int, frame: Any) -> None:
    """Dumps, then does what the signal would have done without amem (see the design note)."""
    name = signal.Signals(signum).name
    previous = _always_on.get("previous", {}).get(signum, signal.SIG_DFL)
    if _always_on.get("path") and previous is not signal.default_int_handler:  # Ctrl-C: atexit dumps
        _dump_quietly(Path(_always_on["path"]), f"at {name}")
    if callable(previous):
        previous(signum, frame)
        return
    signal.signal(signum, signal.SIG_DFL if previous is None else previous)
    if previous in (signal.SIG_DFL, None):
        os.kill(os.getpid(), signum)  # ends the process with the signal's own status


def _install_signal_handlers() -> None:
    """Our handler in front of what was there (main thread only; a signal ignored stays ignored)."""
    if threading.current_thread() is not threading.main_thread() or _always_on.get("previous"):
        return
    previous = {}
    for signum in STOP_SIGNALS:
        current = signal.getsignal(signum)
        if current is signal.SIG_IGN:
            continue
        previous[signum] = current
        signal.signal(signum, _on_stop_signal)
    _always_on["previous"] = previous


def _restore_signal_handlers() -> None:
    previous = _always_on.pop("previous", None) or {}
    if threading.current_thread() is not threading.main_thread():
        return
    for signum, handler in previous.items():
        if signal.getsignal(signum) is _on_stop_signal:
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)


class _Flusher(threading.Thread):
    """AMEM_TRACE_FLUSH: rewrites the trace every `seconds` when the allocators changed since."""

    def __init__(self, seconds: float) -> None:
        super().__init__(name="amem-trace-flush", daemon=True)
        self.seconds, self.stopped, self.last = seconds, threading.Event(), None

    def run(self) -> None:
        while not self.stopped.wait(self.seconds):
            source, path = _always_on.get("source"), _always_on.get("path")
            if source is None or not path:
                continue
            state = source.progress()
            if state != self.last:
                _dump_quietly(Path(path), "in the periodic flush")
                self.last = state


def _start_flushing(seconds: float | None) -> None:
    old = _always_on.pop("flusher", None)
    if old is not None:
        old.stopped.set()
    if seconds is not None:
        _always_on["flusher"] = _Flusher(seconds)
        _always_on["flusher"].start()


def start_always_on(path: str | os.PathLike, stacks: str | None = None,
                    max_entries: int = DEFAULT_MAX_ENTRIES, allocator: Any = None,
                    flush_seconds: float | None = None) -> None:
    """Records from now on; dumps to `path` at exit, on SIGTERM and SIGINT, and to oom_path(path)
    on out-of-memory; with flush_seconds, also every that many seconds while events come in.

    With allocator=None this covers amem's CUDA allocators (what AMEM_TRACE does); an
    Allocator is accepted for tests on a CPU (its OOMs do not call the callback: the CUDA entry
    point does that).
    """
    source = device_source(allocator)
    record(True, max_entries=max_entries, stacks=stacks, allocator=source)
    first = "on_oom" not in _always_on
    _always_on.update(path=str(path), source=source, on_oom=_on_oom, pid=os.getpid())
    source.set_oom_callback(_on_oom)
    if first:
        atexit.register(_at_exit)
    _install_signal_handlers()
    _start_flushing(flush_seconds)


def stop_always_on() -> None:
    """Stops the exit, signal, periodic and out-of-memory dumps (recording itself goes on; see stop())."""
    source = _always_on.get("source")
    if source is not None:
        source.set_oom_callback(None)
    _start_flushing(None)
    _restore_signal_handlers()
    _always_on["path"] = None
    _always_on["source"] = None


def always_on_path() -> str | None:
    """The AMEM_TRACE path in effect, or None."""
    return _always_on.get("path")
