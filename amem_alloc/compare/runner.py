"""`amem compare`: run a workload under every allocator configuration, each in a fresh process.

Design note
-----------
The allocator cannot be swapped once CUDA has started, so each configuration gets a process of
its own (compare/child.py), and each child reports its pid.

* real (a GPU is present): the workload runs once per configuration: torch's allocator with
  PYTORCH_CUDA_ALLOC_CONF unset or "expandable_segments:True", and amem with AMEM_ENABLE=1 and
  each policy's AMEM_CONF. Runs go one after another, so their step times do not interfere.
* simulated (no GPU): the workload runs once under prediction (compare/predicted_program.py: fake CUDA
  tensors, the allocations CUDA's caching allocator would receive); then every configuration
  replays that one allocation sequence through the core on the sim backend, the children running
  side by side. The output says plainly that the figures are predicted without a GPU.

A bar on stderr shows the progress while stderr is a terminal (tqdm's where it is installed, a
plain line where not): the recording's optimizer steps, then the runs. A script is stopped after
`steps` optimizer steps (predict's default, 5; 0: its end), as amem predict stops it. The children
are started, watched and always ended by compare/processes.py. The result
goes to OUT/compare.json (every figure and timeline), OUT/compare.html (compare/table.py; its
plot is inline SVG, so it needs no optional install), OUT/compare.png where matplotlib is
installed (report/plot.py), plus OUT/program.npz (the recorded requests, for `amem
replay`) when simulated, or OUT/trace-<policy>.pickle (each run's allocator trace) when real.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .. import atomic_write
from .. import policies as policies_mod
from ..cuda import gpu_problem  # read here by `amem compare --mode real` too (cli/compare.py)
from . import processes

MODES = ("auto", "real", "simulated")


@dataclass
class CompareResult:
    mode: str                     # "real" or "simulated"
    target: str                   # "workload gpt (size 1)" or "script train.py"
    rows: list[dict]              # one per configuration, in order
    recording: dict | None        # the predicted recording (simulated mode)
    out_dir: Path
    environment: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"mode": self.mode, "target": self.target, "rows": self.rows, "recording": self.recording,
                "environment": self.environment, "files": {k: str(v) for k, v in self.files.items()}}


# ---------------------------------------------------------------------------- processes
def _package_root() -> str:
    return str(Path(__file__).resolve().parents[2])


def _env(policy: policies_mod.Policy | None, real: bool) -> dict:
    """The child's environment: which allocator it runs, and nothing inherited that would change it."""
    env = dict(os.environ)
    for key in ("AMEM_ENABLE", "AMEM_POLICY", "AMEM_CONF", "PYTORCH_CUDA_ALLOC_CONF", "AMEM_TRACE"):
        env.pop(key, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), env.get("PYTHONPATH")) if p)
    if real and policy is not None:
        if policy.native:
            if policy.conf:
                env["PYTORCH_CUDA_ALLOC_CONF"] = policy.conf
        else:
            env.update(AMEM_ENABLE="1", AMEM_POLICY="amem-defaults", AMEM_CONF=policy.conf)  # conf: over the core's defaults
    return env


def _error(stderr: str, returncode: int) -> str:
    lines = [ln for ln in (stderr or "").strip().splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit status {returncode}"


def _child_job(policy: policies_mod.Policy, out: Path, real: bool, args: list[str]) -> processes.Job:
    """The process of one configuration (compare/child.py), writing its row to `out`."""
    return processes.Job("amem_alloc.compare.child", [*args[:1], "--policy", policy.name, "--conf", policy.conf,
                                                      "--out", str(out), *args[1:]],
                         processes.child_env(_env(policy, real)))


def _row(policy: policies_mod.Policy, out: Path, end: processes.Finished) -> dict:
    """One configuration's result dict (with `error` if the child failed)."""
    base = {"policy": policy.name, "conf": policy.conf, "description": policy.description,
            "native": policy.native}
    if end.returncode != 0 or not out.exists():
        return dict(base, error=_error(end.stderr, end.returncode), pid=None, stderr=end.stderr[-20_000:])
    return dict(json.loads(out.read_text()), **base)  # a PolicyRow's dict (replay/evaluation.py) and the run's own


# ---------------------------------------------------------------------------- the two modes
def _record_job(work: Path, workload: str | None, size: int, steps: int | None, script: list[str] | None) -> processes.Job:
    args = ["--out", str(work)]
    args += ["--script", *script] if script else ["--workload", workload, "--size", str(size)]
    if steps is not None:
        args[2:2] = ["--steps", str(steps)]  # before --script, whose arguments are the rest
    return processes.Job("amem_alloc.compare.predicted_program", args, processes.child_env(_env(None, False)),
                         live_stdout=bool(script))  # the script's own output, as it prints it


def _record(children: processes.Children, work: Path, target: tuple, bar) -> dict:
    """Records the workload or script once by prediction, in a child process; its recording.json."""
    from .predicted_program import AMEM_FAILED, INTERRUPTED, SCRIPT_FAILED, steps_done

    workload, _, steps, script = target
    ended: list[processes.Finished] = []
    total = f" of {steps}" if steps else ""
    tick = lambda: bar.set_postfix_str(f"predicting the allocations: step {steps_done(work)}{total}")  # noqa: E731
    children.run([_record_job(work, *target)], 1, lambda i, end: ended.append(end), tick)
    if (work / INTERRUPTED).exists():  # the script raised KeyboardInterrupt (or Ctrl-C reached the child first)
        raise KeyboardInterrupt
    failed = work / SCRIPT_FAILED
    if failed.exists():
        from ..user_script import ScriptFailed, name_of

        sys.stderr.write(ended[0].stderr)
        raise ScriptFailed(name_of(script), json.loads(failed.read_text())["status"])
    if (work / AMEM_FAILED).exists():  # amem failed inside the script: amem's line, not the script's
        from ..predict.failures import AmemFailure

        failure = json.loads((work / AMEM_FAILED).read_text())
        raise AmemFailure(failure["line"], failure["details"])
    if ended[0].returncode != 0:
        raise RuntimeError(f"amem compare: predicting the workload's allocations failed: "
                           f"{_error(ended[0].stderr, ended[0].returncode)}")
    return json.loads((work / "recording.json").read_text())


def _gpu_args(workload: str | None, size: int, steps: int | None, script: list[str] | None,
              policy: policies_mod.Policy) -> list[str]:
    args = ["gpu"] + (["--native"] if policy.native else [])
    if steps is not None:
        args += ["--steps", str(steps)]
    return args + (["--script", *script] if script else ["--workload", workload, "--size", str(size)])


class _PlainBar:
    """Progress without tqdm: one line on the terminal, rewritten in place."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.n, self.text, self.enabled = total, 0, "", enabled and sys.stderr.isatty()

    def set_postfix_str(self, text: str) -> None:
        if text != self.text:
            self.text = text
            self._draw()

    def update(self, n: int) -> None:
        self.n += n
        self._draw()

    def _draw(self) -> None:
        if self.enabled:
            sys.stderr.write(f"\ramem compare: {self.n}/{self.total} runs done; {self.text}\x1b[K")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def _progress(total: int, enabled: bool):
    """A bar on stderr while it is a terminal: tqdm's where it is installed, a plain line where not."""
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is optional
        return _PlainBar(total, enabled)
    return tqdm(total=total, desc="amem compare", unit="run", file=sys.stderr,
                disable=not (enabled and sys.stderr.isatty()), leave=False)


def _run_all(children: processes.Children, policies: list, work: Path, real: bool, child_args, bar,
             jobs: int) -> list[dict]:
    rows: list[dict | None] = [None] * len(policies)
    outs = [work / f"result-{i}.json" for i in range(len(policies))]

    def done(i: int, end: processes.Finished) -> None:
        rows[i] = _row(policies[i], outs[i], end)
        bar.set_postfix_str(f"{policies[i].name} done")
        bar.update(1)

    children.run([_child_job(p, outs[i], real, child_args(p)) for i, p in enumerate(policies)],
                 1 if real else jobs, done)
    return rows  # type: ignore[return-value]


def _cuda_available() -> bool:
    return gpu_problem() is None


def _environment(mode: str, rows: list[dict], recording: dict | None) -> dict:
    import platform

    device = next((r.get("device") for r in rows if r.get("device")), None)
    torch_version = next((r.get("torch") for r in rows if r.get("torch")), None) or (recording or {}).get("torch")
    return {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "torch": torch_version,
            "python": platform.python_version(), "device": device or "none: predicted without a GPU",
            "mode": mode}


# ---------------------------------------------------------------------------- entry point
def _check(workload: str | None, script: list[str] | None, size: int, mode: str) -> None:
    from .. import workloads

    if (workload is None) == (not script):
        raise ValueError("amem compare: give a bundled workload or a script (one of the two)")
    if workload is not None:
        workloads.get(workload)  # ValueError naming the choices
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"amem compare: size must be an integer >= 1, got {size!r}")
    if mode not in MODES:
        raise ValueError(f"amem compare: mode must be one of {MODES}, got {mode!r}")


def _simulated(children: processes.Children, out: Path, work: Path, policies: list, target: tuple, bar,
               jobs: int | None) -> tuple[list, dict]:
    """Records once by prediction, then replays per policy; keeps program.npz in `out` for amem replay."""
    recording = _record(children, work, target, bar)
    bar.update(1)
    program = (work / "program.npz").replace(out / "program.npz")
    rows = _run_all(children, policies, work, False, lambda p: ["replay", "--program", str(program)], bar,
                    jobs or min(len(policies), os.cpu_count() or 1))
    return rows, recording


def _real(children: processes.Children, out: Path, work: Path, policies: list, target: tuple, bar) -> list:
    """Runs the workload once per policy, one after another; keeps each run's trace in `out`."""
    rows = _run_all(children, policies, work, True, lambda p: _gpu_args(*target, p), bar, 1)
    for f in work.glob("trace-*.pickle"):
        f.replace(out / f.name)
    return rows


def compare(workload: str | None = None, script: list[str] | None = None, size: int = 1,
            steps: int | None = None, policies: list | None = None, mode: str = "auto",
            out_dir: str | Path | None = None, progress: bool = True, jobs: int | None = None) -> CompareResult:
    """Runs the comparison; writes compare.json, compare.png and compare.html into out_dir."""
    from ..report import plot
    from . import table

    _check(workload, script, size, mode)
    policies = [policies_mod.get(p) if isinstance(p, str) else p
                for p in (policies or policies_mod.DEFAULT_COMPARE)]
    real = mode == "real" or (mode == "auto" and _cuda_available())
    out = Path(out_dir or Path("amem-compare") / (workload or Path(_target_of(script)).stem))
    out.mkdir(parents=True, exist_ok=True)
    if script and steps is None:
        from ..predict.script import DEFAULT_STEPS  # a script stops where amem predict stops it

        steps = DEFAULT_STEPS
    target = (workload, size, steps, script)
    bar = _progress(len(policies) + (0 if real else 1), progress)
    try:
        with processes.sigterm_ends_the_run(), tempfile.TemporaryDirectory(prefix="amem-compare-", dir=out) as tmp, \
                processes.Children(Path(tmp)) as children:
            rows, recording = (_real(children, out, Path(tmp), policies, target, bar), None) if real else \
                _simulated(children, out, Path(tmp), policies, target, bar, jobs)
    finally:
        bar.close()
    _per_step(rows, recording)
    name = f"script {' '.join(script)}" if script else f"workload {workload} (size {size})"
    result = CompareResult("real" if real else "simulated", name, rows, recording, out)
    result.environment = _environment(result.mode, rows, recording)
    if recording is not None:
        result.files["program"] = out / "program.npz"  # amem replay OUT/program.npz --policy ...
    result.files.update(plot.write(result, out))
    result.files["html"] = table.write_html(result, out / "compare.html")
    result.files["json"] = out / "compare.json"
    atomic_write.write_text(result.files["json"], json.dumps(result.to_dict(), indent=1))
    return result


def _per_step(rows: list[dict], recording: dict | None) -> None:
    """Simulated rows: the allocator's own time per step (replay seconds / steps)."""
    steps = (recording or {}).get("steps") or 0
    for row in rows:
        if row.get("mode") == "simulated":
            row["seconds_per_step"] = row["seconds"] / steps if steps else None


def _target_of(script: list[str]) -> str:
    from ..user_script import target_of

    return target_of(script)[0]
