"""Ctrl-C, `kill` and `kill -9`, wherever they land (issue 37): one line, the shell's status, the
same wording in every command, and no child process of amem compare left behind.

No test here races a clock: each waits for a state (a file written, a child process started) and
only then sends its signal; the time limits are bounds on a hang, not guesses of how long a step takes.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from helpers import ROOT, environment_without_amem

pytest.importorskip("torch")
BOUND_S = 240  # the longest any wait below may take before the test fails (a hang, not a slow machine)


def _env() -> dict:
    env = environment_without_amem()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def _amem(*args: str) -> subprocess.Popen:
    """`amem ...` through the console entry point (pyproject.toml's [project.scripts]: amem_command:main),
    in a session of its own so a signal can reach the whole group, as a terminal's Ctrl-C does."""
    code = "import sys, amem_command; sys.argv = ['amem', *sys.argv[1:]]; sys.exit(amem_command.main())"
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(), cwd=ROOT, start_new_session=True)


def _wait_for(what, check):
    """Polls `check` until it gives something true; fails after BOUND_S."""
    end = time.monotonic() + BOUND_S
    while time.monotonic() < end:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    pytest.fail(f"waited {BOUND_S} s for {what}")


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of each process whose parent is `pid` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append((int(entry.name), cmdline))
    return out


def _recording_child(proc: subprocess.Popen) -> int:
    """The pid of amem compare's recording child, once it runs: amem compare is past its imports."""
    found = _wait_for("amem compare's recording child",
                      lambda: [p for p, cmd in _children(proc.pid) if "compare.predicted_program" in cmd])
    return found[0]


def _gone(pid: int) -> bool:
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) == "Z"
    except OSError:
        return True


SLEEPER = textwrap.dedent("""\
    import time, torch
    w = torch.nn.Linear(8, 8).cuda()
    opt = torch.optim.SGD(w.parameters(), lr=0.1)
    w(torch.randn(2, 8, device="cuda")).sum().backward()
    opt.step()
    while True:          # a long training run after its first step
        time.sleep(0.05)
""")


# ---------------------------------------------------------------------------- start-up
def test_ctrl_c_while_the_package_imports_is_one_line_and_130(tmp_path):
    """The entry point catches an interrupt that lands while amem_alloc imports (a slow import held
    open here until the signal comes), where no command has its handler yet."""
    ready = tmp_path / "importing"
    code = textwrap.dedent(f"""
        import sys, time, importlib.abc
        class Slow(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "amem_alloc.cli":
                    open({str(ready)!r}, "w").close()
                    while True:
                        time.sleep(0.05)
                return None
        sys.meta_path.insert(0, Slow())
        import amem_command
        sys.argv = ["amem", "predict", "--workload", "mlp"]
        sys.exit(amem_command.main())
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(), cwd=ROOT)
    _wait_for("the import to start", ready.exists)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=BOUND_S)
    assert proc.returncode == 130 and err == "amem predict: interrupted\n", (proc.returncode, err)


def test_the_interrupted_line_names_the_command_as_typed():
    import amem_command

    assert amem_command.interrupted_line(["amem", "fit", "--arg", "b"]) == "amem fit: interrupted"
    assert amem_command.interrupted_line(["amem", "--help"]) == "amem: interrupted"
    assert amem_command.interrupted_line(["amem"]) == "amem: interrupted"


def test_the_console_script_is_the_entry_module():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'amem = "amem_command:main"' in text and 'py-modules = ["amem_command"]' in text


# ---------------------------------------------------------------------------- a script's own interrupt
def test_a_scripts_keyboard_interrupt_under_predict_is_interrupted(tmp_path):
    script = tmp_path / "stop.py"
    script.write_text("import torch\nx = torch.randn(4, device='cuda')\nraise KeyboardInterrupt\n")
    proc = subprocess.run([sys.executable, "-m", "amem_alloc", "predict", "--", "python", str(script)],
                          capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=BOUND_S)
    assert proc.returncode == 130 and proc.stderr == "amem predict: interrupted\n", proc.stderr
    assert "failed" not in proc.stderr


def test_a_scripts_keyboard_interrupt_under_compare_is_interrupted(tmp_path):
    script = tmp_path / "stop.py"
    script.write_text("import torch\nx = torch.randn(4, device='cuda')\nraise KeyboardInterrupt\n")
    proc = subprocess.run([sys.executable, "-m", "amem_alloc", "compare", "--no-progress", "--policy", "torch",
                           "--out", str(tmp_path / "c"), "--", "python", str(script)],
                          capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=BOUND_S)
    assert proc.returncode == 130 and proc.stderr == "amem compare: interrupted\n", proc.stderr


# ---------------------------------------------------------------------------- amem compare's children
def test_ctrl_c_during_compare_is_one_line_and_status_130(tmp_path):
    """Sent once amem compare runs its recording child (it used to be sent after a 4 s sleep, which on a
    loaded machine landed in the imports)."""
    script = tmp_path / "long.py"
    script.write_text(SLEEPER)
    proc = _amem("compare", "--no-progress", "--out", str(tmp_path / "c"), "--", "python", str(script))
    child = _recording_child(proc)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
    out, err = proc.communicate(timeout=BOUND_S)
    assert proc.returncode == 130, err
    assert err == "amem compare: interrupted\n" and out == ""
    assert _gone(child)
    assert not list((tmp_path / "c").glob("amem-compare-*")), "the work folder is removed"


def test_a_ctrl_c_while_a_child_starts_still_ends_that_child(tmp_path, monkeypatch):
    """The signal lands inside Popen, after the fork and before Popen returns: on a loaded machine the
    child can be running (and the test above see it) well before amem holds its handle. That child is
    still ended and waited for (processes.py holds SIGINT back while a child starts)."""
    from amem_alloc.compare import processes

    started = []
    popen = processes.subprocess.Popen

    def popen_then_ctrl_c(*args, **kwargs):
        started.append(popen(*args, **kwargs))
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, before Popen has returned to amem
        return started[-1]

    monkeypatch.setattr(processes.subprocess, "Popen", popen_then_ctrl_c)
    job = processes.Job("timeit", ["-n", "1", "-r", "1", "import time; time.sleep(600)"], dict(os.environ))
    try:
        with pytest.raises(KeyboardInterrupt), processes.Children(tmp_path) as children:
            children.run([job], 1, lambda i, end: None)
        assert started and started[0].returncode is not None, "the child was ended and waited for"
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_kill_ends_compare_and_its_children(tmp_path):
    """SIGTERM reaches amem compare alone (kill PID, a job scheduler): it ends its children itself."""
    script = tmp_path / "long.py"
    script.write_text(SLEEPER)
    proc = _amem("compare", "--no-progress", "--out", str(tmp_path / "c"), "--", "python", str(script))
    child = _recording_child(proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=BOUND_S)
    assert proc.returncode == 128 + signal.SIGTERM and err == "amem compare: terminated\n", (proc.returncode, err)
    assert _gone(child)


def test_kill_9_of_compare_ends_its_children(tmp_path):
    """Nothing in amem compare sees SIGKILL: the child asked Linux to end it with its parent."""
    script = tmp_path / "long.py"
    script.write_text(SLEEPER)
    proc = _amem("compare", "--no-progress", "--out", str(tmp_path / "c"), "--", "python", str(script))
    child = _recording_child(proc)
    _wait_for("the child to be past its start", lambda: (tmp_path / "c").exists() and
              any((tmp_path / "c").glob("amem-compare-*/steps_done")))
    proc.kill()
    proc.communicate(timeout=BOUND_S)
    _wait_for(f"child {child} to end with its parent", lambda: _gone(child))
    # the child's scratch folders are named by it; the next prediction's removes them (scratch.py)
    from amem_alloc.predict import scratch

    left = list(Path(tempfile.gettempdir()).glob(f"amem-*-{child}-*"))
    assert left, "the killed child made its scratch folders under its own process id"
    for kind in ("children", "nvidia-smi"):
        scratch.remove_orphans(kind)
    assert not [p for p in left if p.exists()]


CATCHES_CTRL_C = """
try:
    while True:
        time.sleep(0.05)
except KeyboardInterrupt:
    print("Exiting from training early", flush=True)
    raise FileNotFoundError("model.pt")   # the checkpoint the script would have saved
"""


@pytest.mark.parametrize("catches", [False, True])
def test_kill_ends_predict_with_one_line_and_its_scratch_folders_removed(tmp_path, catches):
    """SIGTERM (kill PID; `timeout` when its limit passes) ended amem predict at once: nothing
    printed, and its scratch folders (the stand-in nvidia-smi's, the child watch's) left in the
    temporary folder. It unwinds now: "amem predict: terminated", 143, the folders gone. A script
    that catches KeyboardInterrupt (word_language_model: "Exiting from training early", then it
    loads a checkpoint never saved) does not see it, as under plain Python, where SIGTERM ends it:
    it was read as "the script failed" after 600 s of recording."""
    script = tmp_path / "long.py"
    body = SLEEPER.replace("while True:", "print('first step done', flush=True)\nwhile True:")
    if catches:
        body = body[:body.index("while True:")] + CATCHES_CTRL_C
    script.write_text(body)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    code = "import sys, amem_command; sys.argv = ['amem', *sys.argv[1:]]; sys.exit(amem_command.main())"
    proc = subprocess.Popen([sys.executable, "-c", code, "predict", "--", "python", str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**_env(), "TMPDIR": str(scratch)}, cwd=ROOT, start_new_session=True)
    _wait_for("the script's first step", lambda: [p for p in scratch.iterdir() if p.name.startswith("amem-")]
              and proc.stdout.readline().startswith("first step done"))
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=BOUND_S)
    assert proc.returncode == 128 + signal.SIGTERM and err.endswith("amem predict: terminated\n"), (proc.returncode, err)
    assert "Exiting from training early" not in out and "Traceback" not in err, (out, err)
    assert [p.name for p in scratch.iterdir() if p.name.startswith("amem-")] == []


def test_a_stop_signal_landing_in_a_dropping_callback_is_sent_again(monkeypatch):
    """Ctrl-C raised inside the garbage collector's phase callback was printed as "Exception
    ignored in: <bound method CollectorWatch._phase ...>" and lost: the run went on. There the
    handler sends the signal again a moment later; elsewhere Ctrl-C raises KeyboardInterrupt and
    SIGTERM Terminated (no KeyboardInterrupt: a script's own `except KeyboardInterrupt` must not
    catch what under plain Python ends it)."""
    from amem_alloc.predict import stop_signals
    from helpers import collector_callback_frame

    resent = []

    class Timer:
        def __init__(self, delay, fn, args):
            resent.append((fn, args))

        def start(self):
            pass
    monkeypatch.setattr(stop_signals.threading, "Timer", Timer)
    assert stop_signals._handler(signal.SIGINT, collector_callback_frame()) is None
    assert resent == [(signal.raise_signal, (signal.SIGINT,))]
    with pytest.raises(KeyboardInterrupt) as raised:
        stop_signals._handler(signal.SIGINT, sys._getframe())
    assert type(raised.value) is KeyboardInterrupt
    with pytest.raises(stop_signals.Terminated) as raised:
        stop_signals._handler(signal.SIGTERM, sys._getframe())
    assert not isinstance(raised.value, (KeyboardInterrupt, Exception))
