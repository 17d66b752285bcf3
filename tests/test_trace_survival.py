"""AMEM_TRACE survives how jobs end (amem_alloc/recording.py): SIGTERM (what torchrun, Slurm and
Kubernetes send) and SIGINT dump the trace, then end the process with the signal's own status, or
hand over to the user's own handler; SIGKILL and os._exit run nothing, so AMEM_TRACE_FLUSH keeps
a loadable trace on disk. The CUDA registry runs on the host backend, as on a CPU-only machine."""
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from amem_alloc import Allocator, load_snapshot, recording

from helpers import ROOT, environment_without_amem

pytestmark = pytest.mark.skipif(not hasattr(__import__("amem_alloc")._C, "registry_use_backend"),
                                reason="this build has no registry_use_backend")

JOB = """
import ctypes, os, signal, sys, time
import amem_alloc
from amem_alloc import _C
{before}
_C.registry_use_backend("host", 256 << 20)   # the CUDA registry, on host memory
amem_alloc.enable()                            # AMEM_TRACE: always-on mode
lib = ctypes.CDLL(_C.__file__)
lib.amem_malloc.restype = ctypes.c_void_p
lib.amem_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
lib.amem_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
for i in range(200):
    p = lib.amem_malloc((i % 7 + 1) << 20, 0, None)
    lib.amem_free(p, 0, 0, None)
keep = lib.amem_malloc(3 << 20, 0, None)
print("ready", flush=True)
{then}
"""


def start(tmp_path, env=None, before="", then="time.sleep(60)"):
    path = tmp_path / "trace.pickle"
    code = textwrap.dedent(JOB).format(before=textwrap.dedent(before), then=then)
    full_env = environment_without_amem()
    full_env.update({"PYTHONPATH": str(ROOT), "AMEM_TRACE": str(path), **(env or {})})
    proc = subprocess.Popen([sys.executable, "-c", code], env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    return proc, path


def events(path):
    return [e["action"] for e in load_snapshot(path)["device_traces"][0]]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_dumps_the_trace_and_ends_with_the_signal_s_status(tmp_path, signum):
    proc, path = start(tmp_path)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signum, err  # killed by that signal, as without amem
    actions = events(path)
    assert actions.count("alloc") == 201 and actions[-1] == "alloc"


def test_the_user_s_own_sigterm_handler_still_runs_after_the_dump(tmp_path):
    before = """
        def handler(signum, frame):
            print("user handler", flush=True)
            sys.exit(7)
        signal.signal(signal.SIGTERM, handler)
    """
    proc, path = start(tmp_path, before=before)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 7 and "user handler" in out, err
    assert events(path).count("alloc") == 201


def test_an_ignored_sigterm_stays_ignored(tmp_path):
    proc, path = start(tmp_path, before="signal.signal(signal.SIGTERM, signal.SIG_IGN)",
                       then="time.sleep(1.5)")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err  # it ran to its end; the exit dump wrote the trace
    assert events(path).count("alloc") == 201


@pytest.mark.parametrize("how", ["SIGKILL", "os._exit"])
def test_the_periodic_flush_keeps_a_loadable_trace_for_what_cannot_be_caught(tmp_path, how):
    then = "time.sleep(60)" if how == "SIGKILL" else "time.sleep(1.0); os._exit(3)"
    proc, path = start(tmp_path, env={"AMEM_TRACE_FLUSH": "0.2"}, then=then)
    deadline = time.time() + 30
    while not path.exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # a few more flushes, maybe one in progress when the process dies
    if how == "SIGKILL":
        proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode in (-signal.SIGKILL, 3)
    assert events(path).count("alloc") == 201
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.pickle"]  # no temporary left


def test_a_forked_child_never_overwrites_the_parent_s_trace(tmp_path):
    """A DataLoader worker is a fork: its SIGTERM or its exit must not dump its stale copy."""
    then = """
        for how in ("exit", "sigterm"):
            pid = os.fork()
            if pid == 0:
                if how == "sigterm":
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(5)
                sys.exit(0)
            os.waitpid(pid, 0)
            print(how, os.path.exists(os.environ["AMEM_TRACE"]), flush=True)
    """
    proc, path = start(tmp_path, then=textwrap.dedent(then))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out.split() == ["exit", "False", "sigterm", "False"], out + err
    assert events(path).count("alloc") == 201  # the parent's own exit dump


def test_without_the_flush_sigkill_leaves_nothing(tmp_path):
    """What AMEM_TRACE_FLUSH is for: without it a SIGKILL runs no dump at all."""
    proc, path = start(tmp_path)
    proc.kill()
    proc.communicate(timeout=60)
    assert not path.exists()


def test_the_flush_writes_only_when_the_allocator_changed(tmp_path):
    path = tmp_path / "t.pickle"
    a = Allocator(backend="sim")
    recording.start_always_on(path, allocator=a, flush_seconds=0.05)
    try:
        a.malloc(1 << 20)
        deadline = time.time() + 10
        while not path.exists() and time.time() < deadline:
            time.sleep(0.01)
        first = path.stat().st_ino
        time.sleep(0.4)  # nothing happens: no new file (each write is a new inode, renamed over)
        assert path.stat().st_ino == first
        a.malloc(1 << 20)
        deadline = time.time() + 10
        while path.stat().st_ino == first and time.time() < deadline:
            time.sleep(0.01)
        assert [e["action"] for e in load_snapshot(path)["device_traces"][0]].count("alloc") == 2
    finally:
        recording.stop_always_on()
        recording.stop(a)
    assert recording._always_on.get("flusher") is None


def test_stopping_always_on_gives_the_signal_handlers_back():
    a = Allocator(backend="sim")
    before = signal.getsignal(signal.SIGTERM)
    recording.start_always_on("/nonexistent/t.pickle", allocator=a)
    try:
        assert signal.getsignal(signal.SIGTERM) is recording._on_stop_signal
    finally:
        recording.stop_always_on()
        recording.stop(a)
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan", "inf"])
def test_a_bad_flush_interval_is_refused(value):
    with pytest.raises(ValueError, match="AMEM_TRACE_FLUSH: bad value"):
        recording.trace_config_from_env({"AMEM_TRACE": "t", "AMEM_TRACE_FLUSH": value})
    assert recording.trace_config_from_env({"AMEM_TRACE": "t", "AMEM_TRACE_FLUSH": "2.5"})["flush_seconds"] == 2.5
