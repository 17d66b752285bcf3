"""Inductor's wrappers kept between predictions: a graph torch partitioned the same way again is not
lowered, scheduled and generated again.

A compiled region's graphs are lowered by inductor on every prediction (compile_trace.py), the
larger part of what a compiled prediction costs. torch keeps its compiled graphs between runs for
the same reason (its FX graph cache); the wrapper a prediction replays is that compile's output,
so it is kept by torch's own key for it (`FxGraphCache.prepare_key`: the partitioned graph, its
inputs' sizes and strides, inductor's config, torch's and Triton's versions, the deterministic
settings), to which amem adds what torch's key leaves to the machine: the card the prediction is
for (its name, capability and properties as inductor was told them) and amem's own version.

What is kept per graph: the wrapper's source and the strides inductor gave the graph's outputs
(AOTAutograd lowers the backward for them). Where torch will not key a graph (it bypasses its own
cache for it, or this torch's key functions differ), the graph is lowered as before; where an entry
cannot be read, it is as if absent. Entries are written whole (atomic_write.py) and
the oldest are dropped past `MAX_ENTRIES`. A kept wrapper is Python that the replay executes, as
torch executes its own cached code: the folder is the user's own (never a shared one).

    $AMEM_COMPILE_CACHE   a folder, or "off" (default: $XDG_CACHE_HOME/amem_alloc/inductor,
                          ~/.cache by default)
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ... import atomic_write
from ...version import __version__
from . import source_keys

FORMAT = 1
MAX_ENTRIES = 512


@dataclass
class Entry:
    wrapper: str
    output_strides: list | None   # per graph output: its strides, None where not a tensor; None: not told
    estimates: list = field(default_factory=list)   # what inductor's code generation had to assume (notes)


def folder() -> Path | None:
    """Where entries live, or None where the cache is off."""
    chosen = os.environ.get("AMEM_COMPILE_CACHE", "")
    if chosen.lower() in ("off", "0", "no", "false"):
        return None
    if chosen:
        return Path(chosen)
    try:
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "amem_alloc" / "inductor"
    except RuntimeError:   # no home folder to be found: nothing is kept
        return None


def key(gm, example_inputs, kw: dict, props) -> str | None:
    """The graph's key (torch's, and the card's and amem's parts), or None where torch keys it not."""
    place = folder()
    if place is None:
        return None
    source_keys.prime(place)
    torch_key = _torch_key(gm, example_inputs, kw)
    if torch_key is None:
        return None
    ours = {"torch": torch_key, "amem": __version__, "format": FORMAT,
            "card": vars(props)}
    return hashlib.sha256(json.dumps(ours, sort_keys=True, default=str).encode()).hexdigest()


def _torch_key(gm, example_inputs, kw: dict) -> str | None:
    """torch's FX graph cache key for this compile, as compile_fx_inner computes it; None where
    torch bypasses its cache for the graph or this torch's functions differ."""
    try:
        from torch._inductor.codecache import FxGraphCache
        from torch._inductor.compile_fx import get_input_idxs_to_check

        inputs_to_check = get_input_idxs_to_check(example_inputs, kw.get("static_input_idxs") or [])
        key_info, _ = FxGraphCache.prepare_key(gm, example_inputs, kw, inputs_to_check, False)
    except Exception:
        return None
    return key_info[0] if key_info else None


def load(graph_key: str | None) -> Entry | None:
    """The entry kept for `graph_key`, or None (absent, unreadable, another format)."""
    path = _path(graph_key)
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT or not isinstance(data.get("wrapper"), str):
            return None
        os.utime(path)   # recently used: kept longest
        return Entry(data["wrapper"], data.get("output_strides"), list(data.get("estimates") or []))
    except (OSError, ValueError, AttributeError):
        return None


def store(graph_key: str | None, entry: Entry) -> None:
    """Keep `entry` (written whole or not at all; a folder that cannot be written is no error)."""
    path = _path(graph_key)
    if path is None:
        return
    data = json.dumps({"format": FORMAT, "wrapper": entry.wrapper, "output_strides": entry.output_strides,
                       "estimates": entry.estimates})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write.write_text(path, data)
        _prune(path.parent)
    except OSError:
        return


def _path(graph_key: str | None) -> Path | None:
    place = folder()
    return None if place is None or not graph_key else place / f"{graph_key}.json"


def _prune(place: Path) -> None:
    entries = sorted(place.glob("*.json"), key=lambda p: p.stat().st_mtime)
    for old in entries[:max(0, len(entries) - MAX_ENTRIES)]:
        old.unlink(missing_ok=True)
