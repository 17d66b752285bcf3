"""torch's and Triton's source hashes kept between predictions, so a compiled prediction does not
read both libraries' sources again to key inductor's wrappers (wrapper_cache.py).

torch's FX graph cache key includes `torch_key()` (a hash of every module of torch) and
`triton_key()` (Triton's compiler, language and its 500 MB `libtriton.so`); torch computes them
once per process, together about 0.5 s of CPU on a 2-core machine with the files in the page cache
(1.2 s from disk), which each compiled prediction paid again. torch itself hands `torch_key` to its compile workers the same way (`torch_key.set`,
compile_worker/__main__.py): a value computed by an earlier process is set before torch would
compute it. Here each value is kept with a fingerprint of the files its hash reads (path, size and
modification time of each module torch's walk finds, plus the library's version); a fingerprint
that differs (torch or Triton reinstalled or edited) computes and keeps the value anew.

Where this torch's key functions cannot be set (torch before `prefetchable_cache`), nothing is
kept and torch computes them as before. The values live beside the wrappers, in a folder of their
own (one JSON file, written whole); an unreadable file is as if absent.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

from ... import atomic_write

FILE_NAME = "sources/keys.json"   # beside the wrappers, apart from their entries (pruned by count)
MODULE_SUFFIXES = (".py", ".so", ".pyd")


@functools.lru_cache(maxsize=None)   # once per process and folder: torch keeps what was set
def prime(place: Path | None) -> None:
    """Set torch's `torch_key` and `triton_key` from values kept in `place`, computing and keeping
    those not kept (or kept for other sources). Nothing where `place` is None."""
    if place is None:
        return
    kept = _read(place / FILE_NAME)
    changed = False
    for name, function, fingerprint, encode, decode in _keys():
        if not hasattr(function, "set"):
            continue
        try:
            stamp = fingerprint()
            entry = kept.get(name)
            if isinstance(entry, dict) and entry.get("fingerprint") == stamp and "value" in entry:
                _set(function, decode(entry["value"]))
                continue
            kept[name] = {"fingerprint": stamp, "value": encode(function())}
            changed = True
        except Exception:   # torch fails the same way when it keys the graph (wrapper_cache: not kept)
            continue
    if changed:
        _write(place / FILE_NAME, kept)


def _keys():
    """(name, torch's cached function, fingerprint of what it reads, to JSON, from JSON)."""
    from torch._inductor import codecache

    def torch_sources() -> str:
        import torch
        root = Path(torch.__file__).parent
        inductor = root / "_inductor"   # the files torch_key reads beside the modules
        extra = [inductor / "codegen/aoti_runtime/interface.cpp", inductor / "codegen/aoti_runtime/streams.h",
                 inductor / "script.ld"]
        return _fingerprint(torch.__version__, root, [p for p in extra if p.exists()])

    def triton_sources() -> str:
        try:
            import triton
        except ImportError:
            return "no triton"
        root = Path(triton.__file__).parent
        return _fingerprint(getattr(triton, "__version__", ""), root, sorted(root.glob("_C/libtriton.*")))

    identity = (lambda v: v)
    return [("torch_key", codecache.torch_key, torch_sources, bytes.hex, bytes.fromhex),
            ("triton_key", codecache.triton_key, triton_sources, identity, identity)]


def _fingerprint(version: str, root: Path, extra: list[Path] = ()) -> str:
    """A hash of the library's version and each module file's path, size and modification time,
    walking packages as torch's hash does (pkgutil: a folder counts where it has __init__.py), and
    of the `extra` files its hash reads besides."""
    hasher = hashlib.sha256(f"{version}\0{root}\n".encode())
    for path in extra:
        st = path.stat()
        hasher.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    folders = [str(root)]
    while folders:
        with os.scandir(folders.pop()) as listing:
            entries = sorted(listing, key=lambda e: e.name)
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if os.path.exists(os.path.join(entry.path, "__init__.py")):
                    folders.append(entry.path)
            elif entry.name.endswith(MODULE_SUFFIXES):
                st = entry.stat()
                hasher.update(f"{entry.path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return hasher.hexdigest()


def _set(function, value) -> None:
    try:
        function.set(value)
    except RuntimeError:   # computed already in this process: torch's own value stands
        pass


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(path: Path, data: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write.write_text(path, json.dumps(data))
    except OSError:
        return
