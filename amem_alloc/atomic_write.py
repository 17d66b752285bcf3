"""Writing an output file whole or not at all: every file amem writes goes through here.

Design note
-----------
A report, an export, a trace or a JSON result that stops half-way (a full disk, a quota, a
SIGKILL in the middle of a dump) must never be left where the output goes: a truncated page or
pickle looks like an output and is not one. So every writer writes a temporary file in the
target's own folder (the same file system, so the final rename is atomic), flushes it, fsyncs it,
then renames it over the target and fsyncs the folder. Readers see the old file or the new one,
never a mix.

The temporary is anonymous where Linux allows it (O_TMPFILE): it has no name until it is complete,
so a process killed while writing leaves nothing behind at all; it is given a hidden name
(`.NAME.PID.RANDOM.amem-tmp`) only for the instant between linking and renaming. Elsewhere it is
a named hidden file from the start; on any failure it is removed. A process killed in that window
(or by an older amem, whose temporaries were `.NAME.PID.THREAD.tmp`) can still leave one: the
next write to the same target removes those whose process is gone.

On failure the target is untouched (an older file there stays), nothing of ours is left in the
folder, and a WriteError (an OSError) says which path and why, in one line:
`report.html: cannot write it: No space left on device; nothing was written there`.

A symbolic link is followed (the file it names is replaced, the link stays). A target that is a
stream rather than a file (/dev/stdout, /dev/null, a pipe) is written straight into: renaming over
it would replace the device node itself.

    with atomic_file("trace.pickle", "wb") as f: pickle.dump(data, f)
    write_text("report.html", page); write_bytes("x.bin", raw)
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
from pathlib import Path
from typing import IO, Any, Iterator

TEMP_SUFFIX = ".amem-tmp"
_ANONYMOUS = hasattr(os, "O_TMPFILE") and os.path.isdir("/proc/self/fd")
_open_file = os.fdopen  # the file object a writer writes through (tests swap in one that fills the disk)


class WriteError(OSError):
    """An output that could not be written; nothing was left at the path (str: one line)."""

    def __init__(self, path: Path, reason: str, code: int | None = None) -> None:
        super().__init__(code, f"cannot write it: {reason}; nothing was written there", str(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


# ---------------------------------------------------------------------------- the temporary
def _temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}")


def _open_temp(path: Path) -> tuple[int, Path | None]:
    """A file descriptor to write, and its name (None: anonymous until complete)."""
    if _ANONYMOUS:
        try:
            return os.open(path.parent, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o666), None
        except OSError as err:  # a file system without O_TMPFILE: a named temporary instead
            if err.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
    name = _temp_name(path)
    return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), name


def _give_name(fd: int, path: Path) -> Path:
    """Links an anonymous temporary into the target's folder under a hidden name."""
    name = _temp_name(path)
    proc = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.link(str(fd), name, src_dir_fd=proc, follow_symlinks=True)
    finally:
        os.close(proc)
    return name


def _sync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return  # some file systems refuse to open folders; the rename itself is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove(name: Path | None) -> None:
    if name is not None:
        with contextlib.suppress(OSError):
            os.unlink(name)


# ---------------------------------------------------------------------------- leftovers
_LEFTOVER = re.compile(r"\.(?P<name>.+)\.(?P<pid>\d+)\.(?:[0-9a-f]{8}\.amem-tmp|\d+\.tmp)$")


def _process_gone(pid: int) -> bool:
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # someone else's live process
        return False
    return False


def clean_leftovers(path: str | os.PathLike) -> list[Path]:
    """Removes temporaries of earlier writes to `path` whose process is gone; returns them."""
    path = Path(path)
    removed = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(path.parent if str(path.parent) else "."):
            match = _LEFTOVER.match(entry.name)
            if match and match["name"] == path.name and _process_gone(int(match["pid"])):
                _remove(Path(entry.path))
                removed.append(Path(entry.path))
    return removed


# ---------------------------------------------------------------------------- writing
def _is_stream(path: Path) -> bool:
    """An existing target that is not a regular file or a folder: a device, a pipe, a socket."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def _open_stream(path: Path) -> int:
    """A descriptor for a device or pipe; a pipe nobody reads is an error, not a wait for ever."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ENXIO:  # a FIFO without a reader
            raise WriteError(path, "it is a pipe that no process reads") from None
        raise
    os.set_blocking(fd, True)
    return fd


@contextlib.contextmanager
def _straight_into(path: Path, mode: str, encoding: str | None) -> Iterator[IO[Any]]:
    try:
        with open(_open_stream(path), mode, encoding=encoding) as f:
            yield f
    except WriteError:
        raise
    except OSError as err:
        raise WriteError(path, *_reason(err)) from None


def _reason(err: BaseException) -> tuple[str, int | None]:
    if isinstance(err, OSError):
        return err.strerror or str(err), err.errno
    return f"{type(err).__name__}: {err}", None


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb", encoding: str | None = None) -> Iterator[IO[Any]]:
    """A file to write `path` through: renamed over `path` once the block ends without error.

    Any error inside the block (or while finishing) removes the temporary and leaves `path` as
    it was; an OSError becomes a WriteError naming the path, other errors pass through unchanged.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"amem: atomic_file writes whole files ('w' or 'wb'), not mode {mode!r}")
    path = Path(os.path.realpath(path))
    if _is_stream(path):
        with _straight_into(path, mode, encoding if mode == "w" else None) as f:
            yield f
        return
    clean_leftovers(path)
    named: Path | None = None
    try:
        fd, named = _open_temp(path)
        with _open_file(fd, mode, encoding=encoding if mode == "w" else None) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
            if named is None:
                named = _give_name(f.fileno(), path)
        os.replace(named, path)
        named = None
    except OSError as err:
        _remove(named)
        if isinstance(err, WriteError):
            raise
        raise WriteError(path, *_reason(err)) from None
    except BaseException:
        _remove(named)
        raise
    _sync_folder(path.parent if str(path.parent) else Path("."))


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_file(path, "wb") as f:
        f.write(data)
    return Path(path)


def write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    with atomic_file(path, "w", encoding=encoding) as f:
        f.write(text)
    return Path(path)
