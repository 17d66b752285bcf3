"""Every output is written whole or not at all (amem_alloc/atomic_write.py): on a full disk, report,
both exports, replay --json/--plot, predict's three files, compare's page and JSON, snapshot dumps and
the Tracer's JSON leave nothing at the target (an older file there stays as it was), no temporary
behind, and say in one line which path failed and why. A process killed in the middle of a dump
leaves the previous trace intact and no temporary; leftovers of older crashed dumps are removed.

The disk fills for real where the tests may mount a small tmpfs (root); everywhere, a fake file
that raises ENOSPC after a few KiB stands in for it."""
import errno
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import amem_alloc
from amem_alloc import Allocator, atomic_write, cli, load_snapshot

from helpers import ROOT, shared_traces_dir

TRACE = shared_traces_dir() / "small_train.pickle"
needs_trace = pytest.mark.skipif(not TRACE.exists(), reason="../shared/traces is not present")
ENOSPC_TEXT = os.strerror(errno.ENOSPC)


class _FillingFile:
    """A file object over a real descriptor that runs out of space after `room` bytes."""

    def __init__(self, fd, mode, room, encoding=None):
        self._f = os.fdopen(fd, mode, encoding=encoding)
        self._room = room

    def write(self, data):
        size = len(data.encode() if isinstance(data, str) else data)
        if size > self._room:
            self._f.write(data[:self._room])
            self._f.flush()
            raise OSError(errno.ENOSPC, ENOSPC_TEXT)
        self._room -= size
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


@pytest.fixture()
def disk_fills(monkeypatch):
    """Every atomic write runs out of space after 1 KiB (a fake writer: works without root)."""
    monkeypatch.setattr(atomic_write, "_open_file", lambda fd, mode, encoding=None: _FillingFile(fd, mode, 1024,
                                                                                                    encoding))


@pytest.fixture()
def small_tmpfs(tmp_path):
    """A real 8 KiB tmpfs, full but for its old output file (needs root and the right to mount)."""
    mount = tmp_path / "full"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(mount)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root, or no CAP_SYS_ADMIN)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def amem(argv, capsys):
    try:
        rc = cli.main([str(a) for a in argv])
    except SystemExit as done:
        rc = done.code
    out, err = capsys.readouterr()
    return rc, out, err


def only_old_files(folder: Path, expected: set) -> None:
    assert {p.name for p in folder.iterdir()} == expected, "a partial output or a temporary was left"


def assert_write_failure(rc, err, path):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc not in (0, None) and len(lines) == 1, err
    assert "Traceback" not in err and str(path) in lines[0] and ENOSPC_TEXT in lines[0], lines[0]


# ---------------------------------------------------------------------------- the helper itself
def test_a_write_replaces_the_target_whole(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    assert atomic_write.write_text(target, "new " * 1000) == target
    assert target.read_text() == "new " * 1000
    only_old_files(tmp_path, {"out.txt"})


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, disk_fills):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(atomic_write.WriteError) as err:
        atomic_write.write_bytes(target, b"x" * 100_000)
    assert str(err.value) == f"{target}: cannot write it: {ENOSPC_TEXT}; nothing was written there"
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(target)
    assert target.read_bytes() == b"old"
    only_old_files(tmp_path, {"out.bin"})


def test_an_error_of_the_writer_itself_passes_through_and_leaves_nothing(tmp_path):
    target = tmp_path / "out.pickle"
    with pytest.raises((pickle.PicklingError, AttributeError)):
        with atomic_write.atomic_file(target) as f:
            f.write(b"partial")
            pickle.dump(lambda: 0, f)
    only_old_files(tmp_path, set())


@pytest.mark.skipif(not atomic_write._ANONYMOUS, reason="no O_TMPFILE here")
def test_named_temporaries_work_where_anonymous_ones_do_not(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic_write, "_ANONYMOUS", False)
    atomic_write.write_text(tmp_path / "a.txt", "x")
    assert (tmp_path / "a.txt").read_text() == "x"
    only_old_files(tmp_path, {"a.txt"})


def test_a_device_is_written_into_not_replaced(tmp_path):
    """`-o /dev/null` or `-o /dev/stdout`: renaming over the target would replace the device node."""
    import stat

    null = tmp_path / "null"
    try:
        os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a /dev/null of the test's own
    except OSError:
        pytest.skip("cannot make a device node here")
    atomic_write.write_text(null, "discarded")
    assert stat.S_ISCHR(os.stat(null).st_mode)
    only_old_files(tmp_path, {"null"})


def test_a_pipe_nobody_reads_is_an_error_not_a_wait(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    started = time.perf_counter()
    with pytest.raises(atomic_write.WriteError, match="it is a pipe that no process reads"):
        atomic_write.write_text(fifo, "x")
    assert time.perf_counter() - started < 2
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # with a reader, the pipe gets the output
    try:
        atomic_write.write_text(fifo, "through the pipe")
        assert os.read(reader, 100) == b"through the pipe"
    finally:
        os.close(reader)


def test_a_symbolic_link_is_followed_and_kept(tmp_path):
    (tmp_path / "real.txt").write_text("old")
    (tmp_path / "link.txt").symlink_to(tmp_path / "real.txt")
    atomic_write.write_text(tmp_path / "link.txt", "new")
    assert (tmp_path / "link.txt").is_symlink() and (tmp_path / "real.txt").read_text() == "new"


def test_leftovers_of_crashed_writes_are_removed_by_the_next_write(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()  # a pid whose process is gone
    old_style = tmp_path / f".trace.pickle.{dead}.140234.tmp"  # what dumps before atomic_write left
    new_style = tmp_path / f".trace.pickle.{dead}.0a1b2c3d.amem-tmp"
    mine = tmp_path / f".trace.pickle.{os.getpid()}.0a1b2c3d.amem-tmp"  # a live process's: kept
    other = tmp_path / f".other.pickle.{dead}.0a1b2c3d.amem-tmp"  # another target's: kept
    for p in (old_style, new_style, mine, other):
        p.write_bytes(b"partial")
    a = Allocator(backend="sim")
    amem_alloc.dump_snapshot(tmp_path / "trace.pickle", allocator=a)
    assert not old_style.exists() and not new_style.exists()
    assert mine.exists() and other.exists()
    load_snapshot(tmp_path / "trace.pickle")


# ---------------------------------------------------------------------------- every writer, disk full
WRITERS = [
    ("report", lambda out: ["report", TRACE, "-o", out]),
    ("export-chrome", lambda out: ["export", TRACE, "-o", out]),
    ("export-rmm", lambda out: ["export", TRACE, "-f", "rmm", "-o", out]),
    ("replay-json", lambda out: ["replay", TRACE, "--json", out]),
]


@needs_trace
@pytest.mark.parametrize("name, argv", WRITERS, ids=[w[0] for w in WRITERS])
def test_cli_outputs_on_a_full_disk_leave_nothing(name, argv, tmp_path, disk_fills, capsys):
    out = tmp_path / "out.file"
    rc, _, err = amem(argv(out), capsys)
    assert_write_failure(rc, err, out)
    only_old_files(tmp_path, set())


@needs_trace
@pytest.mark.parametrize("name, argv", WRITERS, ids=[w[0] for w in WRITERS])
def test_cli_outputs_on_a_real_full_tmpfs_leave_nothing(name, argv, small_tmpfs, capsys):
    old = "old" * 1366  # two pages: the tmpfs is full
    (small_tmpfs / "out.file").write_text(old)
    rc, _, err = amem(argv(small_tmpfs / "out.file"), capsys)
    assert_write_failure(rc, err, small_tmpfs / "out.file")
    assert (small_tmpfs / "out.file").read_text() == old
    only_old_files(small_tmpfs, {"out.file"})


@needs_trace
def test_replay_plot_on_a_full_disk_leaves_nothing(tmp_path, disk_fills, capsys):
    pytest.importorskip("matplotlib")
    rc, _, err = amem(["replay", TRACE, "--plot", tmp_path / "p.png"], capsys)
    assert_write_failure(rc, err, tmp_path / "p.png")
    only_old_files(tmp_path, set())


def test_predict_outputs_on_a_full_disk_name_the_path_and_leave_nothing(tmp_path, disk_fills, capsys):
    out = tmp_path / "p.json"
    rc, _, err = amem(["predict", "--workload", "mlp", "--policy", "torch", "--json", out], capsys)
    assert_write_failure(rc, err, out)
    assert "None" not in err
    only_old_files(tmp_path, set())


def test_snapshot_dump_and_tracer_json_on_a_full_disk(tmp_path, disk_fills):
    a = Allocator(backend="sim")
    a.record(stacks="python")
    for _ in range(200):
        a.free(a.malloc(3 << 20))
    with pytest.raises(OSError, match=ENOSPC_TEXT):
        amem_alloc.dump_snapshot(tmp_path / "t.pickle", allocator=a)
    with pytest.raises(OSError, match=ENOSPC_TEXT):
        atomic_write.write_text(tmp_path / "p.json", amem_alloc.Tracer().to_json() * 100)
    only_old_files(tmp_path, set())


def test_compare_page_on_a_full_disk_leaves_nothing(tmp_path, disk_fills):
    from amem_alloc.compare import runner, table

    result = runner.CompareResult("simulated", "workload mlp (size 1)", [], None, tmp_path)
    with pytest.raises(OSError, match=ENOSPC_TEXT):
        table.write_html(result, tmp_path / "compare.html")
    only_old_files(tmp_path, set())


# ---------------------------------------------------------------------------- killed while dumping
KILLED_MID_DUMP = """
import os, sys, time
from amem_alloc import Allocator, atomic_write, dump_snapshot
path, signal_file = sys.argv[1], sys.argv[2]
a = Allocator(backend="sim")
a.record(stacks="python")
for _ in range(500):
    a.free(a.malloc(3 << 20))
dump_snapshot(path, allocator=a)                   # the old trace, complete
real_open = atomic_write._open_file

class Slow:                                         # the next dump stalls half-way through
    def __init__(self, f): self.f, self.n = f, 0
    def write(self, data):
        self.n += 1
        if self.n == 2:
            open(signal_file, "w").close()
            time.sleep(60)
        return self.f.write(data)
    def __getattr__(self, name): return getattr(self.f, name)
    def __enter__(self): return self
    def __exit__(self, *exc): self.f.close()

atomic_write._open_file = lambda fd, mode, encoding=None: Slow(real_open(fd, mode, encoding=encoding))
for _ in range(500):
    a.free(a.malloc(5 << 20))
dump_snapshot(path, allocator=a)
"""


@pytest.mark.parametrize("anonymous", [True, False], ids=["o_tmpfile", "named-temporary"])
def test_sigkill_during_a_dump_keeps_the_old_trace_and_leaves_no_temporary(tmp_path, anonymous):
    if anonymous and not atomic_write._ANONYMOUS:
        pytest.skip("no O_TMPFILE here")
    path, mid = tmp_path / "trace.pickle", tmp_path / "mid-dump"
    code = KILLED_MID_DUMP if anonymous else KILLED_MID_DUMP.replace(
        "from amem_alloc import Allocator, atomic_write, dump_snapshot",
        "from amem_alloc import Allocator, atomic_write, dump_snapshot; atomic_write._ANONYMOUS = False")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code, str(path), str(mid)], env=env, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while not mid.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert mid.exists(), proc.stderr.read().decode() if proc.poll() is not None else "the dump never started"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    old = load_snapshot(path)
    assert len(old["device_traces"][0]) > 1000 and old["segments"] is not None
    mid.unlink()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "trace.pickle"]
    if anonymous:
        assert leftovers == []  # an O_TMPFILE temporary has no name until it is complete
    else:  # a named temporary cannot be removed by a process killed with SIGKILL: the next write does it
        assert len(leftovers) == 1
        amem_alloc.dump_snapshot(path, allocator=Allocator(backend="sim"))
        assert [p.name for p in tmp_path.iterdir()] == ["trace.pickle"]
