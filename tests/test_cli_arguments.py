"""No traceback for a user's input anywhere on the `amem` command line: every verb's numeric and
path arguments, fed random values (hypothesis, derandomized, a bounded number of examples each),
either work or give one line on stderr and a non-zero exit. The verbs run in this process; what
would start real work past the arguments (a GPU run, a workload, a script) is stubbed so each
example takes milliseconds. Then the cases once found by hand: a workload size of 10^20, --plot
without matplotlib, --mode real without a GPU, a torch without the pluggable allocator."""
from __future__ import annotations

import contextlib
import io
import os
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amem_alloc import cli, workloads

from helpers import run_python, shared_traces_dir

TRACE = shared_traces_dir() / "tiny_grad.pickle"
needs_trace = pytest.mark.skipif(not TRACE.exists(), reason="../shared/traces is not present")
EXAMPLES = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck), print_blob=False)

NUMBERS = st.one_of(
    st.integers(-10 ** 30, 10 ** 30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", " ", "x", "1e3", "0x10", "nan", "-inf", "-0", "٣", "1_000", "99999999999999999999",
                     "\x00", "--", "1.5"]),
    st.text(max_size=6),
)


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    """Paths a user might give: missing, a folder, a device, a pipe, beneath a file, too long, ...
    (relative ones, like `-`, land in a folder of the test's own)."""
    root = tmp_path_factory.mktemp("paths")
    here = os.getcwd()
    os.chdir(root)
    plain = root / "plain-file"
    plain.write_text("x")
    fifo = root / "pipe"
    os.mkfifo(fifo)
    yield ["", "-", "/", "/dev/zero", "/dev/null", "/proc/self/mem", str(root), str(plain), str(plain / "under"),
           str(fifo), str(root / "missing" / "x.out"), str(root / ("x" * 300)), "bad\x00name", str(root / "new.out")]
    os.chdir(here)


def paths(places):
    return st.sampled_from(places)


def run_verb(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(argv)
        except SystemExit as done:
            rc = done.code
    return rc, err.getvalue()


def works_or_one_line(argv: list[str]) -> None:
    rc, err = run_verb(argv)
    assert "Traceback" not in err, (argv, err)
    if rc in (0, None):
        return
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, (argv, err)
    assert lines[0].startswith("amem"), (argv, lines[0])


@pytest.fixture(autouse=True)
def no_real_work(monkeypatch):
    """Past its arguments a verb would start a GPU run, a workload or a script: stubs instead."""
    from amem_alloc import cuda, user_script
    from amem_alloc.compare import runner

    monkeypatch.setattr(runner, "gpu_problem", lambda: "no GPU in this test")
    monkeypatch.setitem(workloads.WORKLOADS, "mlp", (lambda *a, **k: {}, "a stub"))
    monkeypatch.setattr(cuda, "enable", lambda **k: None)
    monkeypatch.setattr(user_script, "run", lambda *a, **k: 0)
    yield
    from amem_alloc.snapshot import MAX_FILE_BYTES, set_max_trace_bytes

    set_max_trace_bytes(MAX_FILE_BYTES)


# ---------------------------------------------------------------------------- random values, every verb
@needs_trace
@EXAMPLES
@given(data=st.data())
def test_report_arguments(places, data, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("r") / "r.html")
    option = data.draw(st.sampled_from(["--top", "--max-trace-mb", "-o", "trace", "--provenance"]))
    value = data.draw(paths(places) if option in ("-o", "trace", "--provenance") else NUMBERS)
    argv = ["report", str(TRACE), "-o", out]
    argv = ["report", value, "-o", out] if option == "trace" else argv + [option, value]
    works_or_one_line(argv)


@needs_trace
@EXAMPLES
@given(data=st.data())
def test_export_arguments(places, data, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("e") / "t.json")
    option = data.draw(st.sampled_from(["--device", "--max-trace-mb", "-o", "trace"]))
    value = data.draw(paths(places) if option in ("-o", "trace") else NUMBERS)
    argv = ["export", value, "-o", out] if option == "trace" else ["export", str(TRACE), "-o", out, option, value]
    works_or_one_line(argv + ["-f", data.draw(st.sampled_from(["chrome", "rmm"]))])


@needs_trace
@EXAMPLES
@given(data=st.data())
def test_replay_arguments(places, data):
    option = data.draw(st.sampled_from(["--device", "--limit-gb", "--max-trace-mb", "--json", "trace"]))
    value = data.draw(paths(places) if option in ("--json", "trace") else NUMBERS)
    works_or_one_line(["replay", value] if option == "trace" else ["replay", str(TRACE), option, value])


@EXAMPLES
@given(data=st.data())
def test_demo_arguments(data):
    option = data.draw(st.sampled_from(["--steps", "--seed", "--limit-gb"]))
    value = data.draw(NUMBERS)
    if option == "--steps" and value.strip().isdigit() and int(value) > 50:
        value = "-" + value  # a valid large step count is a long demo, not a mistake
    works_or_one_line(["demo", option, value])


@EXAMPLES
@given(data=st.data())
def test_compare_arguments(places, data):
    option = data.draw(st.sampled_from(["--size", "--steps", "--out"]))
    value = data.draw(paths(places) if option == "--out" else NUMBERS)
    works_or_one_line(["compare", "--workload", "mlp", "--mode", "real", "--no-progress", option, value])


@EXAMPLES
@given(data=st.data())
def test_predict_arguments(places, data):
    option = data.draw(st.sampled_from(["--size", "--steps", "--capacity-gb", "--json", "--trace", "--report"]))
    value = data.draw(paths(places) if option in ("--json", "--trace", "--report") else NUMBERS)
    argv = ["predict", "--workload", "mlp", "--policy", "torch", option, value]
    if option in ("--json", "--trace", "--report") and value.endswith("new.out"):
        return  # a valid output: a whole (stubbed) prediction is written, covered elsewhere
    works_or_one_line(argv)


@EXAMPLES
@given(data=st.data())
def test_run_arguments(places, data):
    works_or_one_line(["run", data.draw(paths(places)), "--lr", "3"])


# ---------------------------------------------------------------------------- the cases found by hand
def test_a_workload_size_of_10_to_the_20_is_one_line():
    rc, err = run_verb(["predict", "--workload", "mlp", "--size", "99999999999999999999"])
    assert rc == 2 and err.strip() == "amem predict: --size 99999999999999999999: a workload takes an integer " \
                                      "from 1 to 4,096", err
    with pytest.raises(ValueError, match="--steps 0"):
        workloads.get("gpt")(1, 0)


@needs_trace
def test_plot_without_matplotlib_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    rc, err = run_verb(["replay", str(TRACE), "--plot", str(tmp_path / "p.png")])
    assert rc == 2 and err.strip() == ("amem replay: --plot needs matplotlib, which is not installed; install it with "
                                       "`python -m pip install 'amem_alloc[plots]'`, or give --plot OUT.svg, which "
                                       "needs no install"), err
    assert not (tmp_path / "p.png").exists()
    rc, err = run_verb(["replay", str(TRACE), "--policy", "torch,amem", "--plot", str(tmp_path / "p.svg")])
    assert rc == 0 and err == "", err
    svg = (tmp_path / "p.svg").read_text()
    assert svg.startswith("<svg xmlns='http://www.w3.org/2000/svg'") and svg.count("<polyline") >= 4


def test_compare_mode_real_without_a_gpu_is_one_line_before_any_child(monkeypatch, tmp_path):
    from amem_alloc.compare import runner

    monkeypatch.setattr(runner, "gpu_problem", lambda: "torch sees no CUDA device")
    monkeypatch.setattr(runner, "_run_all", lambda *a, **k: pytest.fail("a child was started"))
    rc, err = run_verb(["compare", "--workload", "mlp", "--mode", "real", "--out", str(tmp_path / "c")])
    assert rc == 2 and err.strip().startswith("amem compare: --mode real needs a GPU: torch sees no CUDA device;")


def test_run_on_a_torch_without_the_pluggable_allocator_is_one_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('the script ran')\n")
    proc = run_python(f"""
        import sys, torch
        del torch._C._cuda_customAllocator          # what a torch built without CUDA lacks
        from amem_alloc import cli
        sys.exit(cli.main(["run", {str(script)!r}]))
    """)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "has no pluggable CUDA allocator" in lines[0] and "install a CUDA build of torch" in lines[0]
    assert "the script ran" not in proc.stdout
