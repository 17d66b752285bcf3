"""`amem doctor`: what is installed, and whether amem can do what the environment asks of it.

Design note
-----------
amem can be silently off: AMEM_ENABLE=1 and AMEM_TRACE act through a start-up hook
(amem_alloc_autoenable.pth in site-packages) that an install may lack, and amem needs a torch
with a pluggable CUDA allocator, and a GPU that can map pages for its default policy. This
checks each of those in the order they matter and prints one line per finding:

    ok   torch 2.14.1+cu130 (CUDA 13.0): the pluggable allocator API is there
    !!   AMEM_ENABLE=1 is set, but the start-up hook is not installed ...

A line marked `!!` is a problem (the exit status is then 1) and says what to do. Nothing here
starts CUDA in torch: the GPU is asked through torch's query (NVML) and the driver's own
attribute for virtual memory management (cuDeviceGetAttribute), as the cuda backend asks it.
"""
from __future__ import annotations

import ctypes
import os
import site
import sys
import sysconfig
from pathlib import Path
from typing import Any, Callable

HOOK = "amem_alloc_autoenable.pth"
ENV = ("AMEM_ENABLE", "AMEM_TRACE", "AMEM_TRACE_STACKS", "AMEM_TRACE_ENTRIES", "AMEM_TRACE_FLUSH", "AMEM_CONF",
       "AMEM_POLICY")
CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102

Finding = tuple  # (ok: bool, text)


# ---------------------------------------------------------------------------- the package
def _site_dirs() -> list[Path]:
    dirs = [*site.getsitepackages(), site.getusersitepackages(), sysconfig.get_paths()["purelib"]]
    return list(dict.fromkeys(Path(d) for d in dirs))


def hook_path() -> Path | None:
    """Where the start-up hook is installed, or None."""
    return next((d / HOOK for d in _site_dirs() if (d / HOOK).is_file()), None)


def _package() -> list[Finding]:
    from . import _C
    from .version import __version__

    where = Path(__file__).parent  # the package's folder (doctor.py sits beside its __init__.py)
    finders = [f for d in _site_dirs() for f in d.glob("__editable___amem_alloc*finder.py")]
    if any(str(where) in f.read_text(errors="replace") for f in finders):
        how = "an editable install"
    elif any(where.parent == d for d in _site_dirs()):
        how = "installed"
    else:
        how = "a source tree on sys.path (PYTHONPATH or the working folder)"
    return [(True, f"amem_alloc {__version__} from {where} ({how}); extension {Path(_C.__file__).name}")]


def _hook() -> list[Finding]:
    path, asked = hook_path(), os.environ.get("AMEM_ENABLE", "").strip() not in ("", "0")
    if path is None:
        fix = ("reinstall with `python -m pip install --no-build-isolation -e .` (it installs the hook now) or "
               f"copy amem_alloc/{HOOK} into {_site_dirs()[0]}")
        return [(not asked, f"start-up hook {HOOK} is not installed: AMEM_ENABLE=1 and AMEM_TRACE act only in "
                            f"`amem run` and where the script calls enable(); {fix}")]
    active = "amem_alloc._autoenable" in sys.modules
    state = "ran in this process" if active else "runs in every process started with AMEM_ENABLE=1"
    return [(True, f"start-up hook installed at {path}: it {state}")]


def _environment() -> list[Finding]:
    from . import config, recording

    found = [(True, f"{name}={os.environ[name]!r}") for name in ENV if os.environ.get(name, "").strip()]
    checks: list[tuple[str, Callable[[], Any]]] = [
        ("AMEM_TRACE", recording.trace_config_from_env), ("AMEM_CONF/AMEM_POLICY", config.resolve_with_policy)]
    for what, check in checks:
        try:
            check()
        except ValueError as err:
            found.append((False, f"{what}: {str(err).removeprefix('amem: ')}"))
    enable = os.environ.get("AMEM_ENABLE", "").strip()
    if enable not in ("", "0", "1"):
        found.append((False, f"AMEM_ENABLE={enable!r}: use 1 to make amem torch's CUDA allocator, or 0"))
    if os.environ.get("AMEM_TRACE", "").strip() and enable != "1":
        found.append((True, "AMEM_TRACE is read by enable(): it records under `amem run`, AMEM_ENABLE=1, or a "
                            "script that calls amem_alloc.enable()"))
    return found or [(True, "no AMEM_* variable is set")]


# ---------------------------------------------------------------------------- torch and the GPU
def _torch() -> tuple[list[Finding], Any]:
    try:
        import torch
    except Exception as err:  # noqa: BLE001 - any failure to import torch is the finding
        return [(False, f"torch cannot be imported ({type(err).__name__}: {err}); install a CUDA build of torch")], None
    from . import _C
    from .cuda import pluggable_problem

    cuda = torch.version.cuda
    problem = pluggable_problem(torch)
    found = [(problem is None, problem or f"torch {torch.__version__} (CUDA {cuda}): the pluggable allocator API "
                                          "is there")]
    oom = _C.torch_oom_available()
    found.append((True, "torch.OutOfMemoryError from amem: " + ("c10::OutOfMemoryError found in torch's libraries"
                  if oom else "c10::OutOfMemoryError not found (a RuntimeError instead)")))
    return found, torch


def _vmm(device: int) -> str:
    """The driver's answer for virtual memory management (expandable segments), without torch."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        handle, value = ctypes.c_int(), ctypes.c_int()
        if lib.cuInit(0) != 0 or lib.cuDeviceGet(ctypes.byref(handle), device) != 0:
            return "unknown (the driver did not start)"
        if lib.cuDeviceGetAttribute(ctypes.byref(value), CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                    handle) != 0:
            return "unknown (the driver did not say)"
    except OSError:
        return "unknown (no libcuda.so.1)"
    return "yes" if value.value else "no: amem's policy falls back to plain segments"


def _gpu(torch: Any) -> list[Finding]:
    if torch is None:
        return []
    from .cuda import gpu_problem

    problem = gpu_problem()
    if problem:
        return [(True, f"GPU: none usable ({problem}); amem predict and amem replay need none")]
    found = []
    for d in range(torch.cuda.device_count()):
        found.append((True, f"GPU {d}: {torch.cuda.get_device_name(d)}; virtual memory management: {_vmm(d)}"))
    return found


def _hook_running() -> bool:
    """Whether site is processing a .pth file right now (the hook imports amem_alloc through it)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "addpackage" and "site" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def note_if_hook_inactive() -> None:
    """At `import amem_alloc`: AMEM_ENABLE=1 without the start-up hook having run says so, once."""
    if os.environ.get("AMEM_ENABLE", "").strip() != "1" or "amem_alloc._autoenable" in sys.modules:
        return
    if not _hook_running():
        print(f"amem: AMEM_ENABLE=1 is ignored in this process: the start-up hook ({HOOK}) did not run, so amem "
              "is torch's allocator only if the script calls amem_alloc.enable() or runs under `amem run`; "
              "`amem doctor` says how to install the hook", file=sys.stderr)


# ---------------------------------------------------------------------------- the command
def findings() -> list[Finding]:
    torch_found, torch = _torch()
    return [*_package(), *_hook(), *_environment(), *torch_found, *_gpu(torch)]


def main(out: Any = None) -> int:
    """Prints every finding, one line each; 1 when one of them is a problem."""
    out = out or sys.stdout
    found = findings()
    for ok, text in found:
        print(f"{'ok' if ok else '!!'}   {text}", file=out)
    problems = sum(not ok for ok, _ in found)
    print(f"\n{problems} problem{'s' if problems != 1 else ''} found" if problems else "\nno problem found", file=out)
    return 1 if problems else 0
