"""Scratch folders a prediction makes in the temporary directory, and those a killed one left.

Design note
-----------
A prediction keeps a few things in folders of its own while it runs (the stand-in nvidia-smi, the
reports of spawned children, scratch copies of checkpoints) and removes them when it ends, Ctrl-C
and SIGTERM included. Nothing runs on SIGKILL: `kill -9`, the kernel's OOM killer, or amem compare's
recording child ended with its parent (processes.py asks Linux for SIGKILL there, so that a script
ignoring SIGTERM cannot outlive it). So each folder's name carries the process id that made it,
`amem-<kind>-<pid>-<random>`, and making one removes the folders of that kind whose process is gone
(ours only: same owner). A live process's folders, and any folder not named this way, are left.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile

PREFIX = "amem-"


def make(kind: str) -> str:
    """A new scratch folder for `kind` (removed by its caller), after removing those killed runs left."""
    remove_orphans(kind)
    return tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-{os.getpid()}-")


def remove_orphans(kind: str, where: str | None = None) -> list[str]:
    """Removes `kind`'s folders in `where` (the temporary directory) whose process has ended; returns them."""
    removed: list[str] = []
    if os.name != "posix":   # no process ids to test without signals
        return removed
    where = where or tempfile.gettempdir()
    pattern = re.compile(rf"{re.escape(PREFIX + kind)}-(\d+)-[^/]+\Z")
    try:
        names = os.listdir(where)
    except OSError:
        return removed
    for name in names:
        match = pattern.match(name)
        path = os.path.join(where, name)
        if match and _ours(path) and not _alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _ours(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return os.path.isdir(path) and not os.path.islink(path) and st.st_uid == os.getuid()


def _alive(pid: int) -> bool:
    """Whether `pid` runs: a zombie (ended, its parent killed before reaping it) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass   # exists, another user's
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True   # no /proc (macOS): it exists
