"""What a process holds on the GPU outside torch's caching allocator: the CUDA context and the
libraries' own memory, line by line, each saying where its figure comes from.

Design note
-----------
What nvidia-smi lists for a training process is the device total: the caching allocator's reserved
memory plus what the allocator never sees. That part depends on the stack, not the model:

* the CUDA context: the driver's state for the process, its size set by the card, the driver and
  CUDA's module loading. torch sets CUDA_MODULE_LOADING=LAZY where it is unset
  (aten/src/ATen/cuda/detail/CUDAHooks.cpp, `CUDAHooks::init`), so a kernel's code is loaded on
  its first launch; EAGER loads every kernel of torch when CUDA starts;
* the libraries the program initialises, each on first use: cuBLAS/cuBLASLt (their handles and
  kernels; the workspaces torch hands them come from the caching allocator and are in the
  prediction already, rules/cublas.py), torch's own kernels as they are first launched, cuDNN
  (its handle and engines), NCCL (its communicator, one per process group).

The figures are measurements of that stack (`amem doctor --calibrate`, calibration.py: each stage
a fresh process, NVML's figure for the process less torch's reserved memory), either the one
kept with amem (`BUILTIN`: an NVIDIA H200, driver 580.159.04, torch 2.11.0+cu130, 2026-11-27;
benchmarks/gpu_runs/h200-2026-11-27) or the user's own calibration file for the card predicted.
They do not add up library by library: the parts share the code memory the driver grows in
steps. Measured on the H200, beyond the 518 MiB context: cuBLAS alone 158 MiB, cuDNN alone 110,
a training step with cuBLAS 240, an inference loop with cuBLAS 188 (hf_generate, a real program),
and ResNet-50 trained with cuDNN and cuBLAS 240 or 244 (with cudnn.benchmark): cuDNN added nothing
beyond a training step. So the libraries' total is the figure of the largest stage the program
went through (a training step if it ran a backward pass, else an inference loop if it ran a
kernel), with cuDNN adding what its own stage holds beyond that and NCCL its communicator; the
lines split that total into cuBLAS, torch's kernels and cuDNN.

Uncertainty: on the measured stack, 11 real programs held 706-764 MiB outside the allocator, each
within -16/+6 MiB of this model (benchmarks/RESULTS.md, "The device total"): 16 MiB. A card of
another architecture, another CUDA major version or eager loading adds a share of the figure
(below, `_SPREAD`): those stacks were not measured, and the lines say "estimated".
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

MiB = 1 << 20

MEASURED, DOCUMENTED, ESTIMATED, GIVEN = "measured", "documented", "estimated", "given"

# amem doctor --calibrate on a lent NVIDIA H200 (benchmarks/gpu_runs/h200-2026-11-27/calibration.json);
# inference_step: hf_generate held 706 MiB outside the allocator at its end (predict_vs_real.json)
BUILTIN = {
    "device": "NVIDIA H200", "capability": (9, 0), "driver": "580.159.04", "torch": "2.11.0+cu130", "cuda": "13.0",
    "date": "2026-11-27", "context": 518 * MiB,
    "beyond_context": {"context_eager": 732 * MiB, "cublas": 158 * MiB, "cudnn": 110 * MiB,
                       "training_step": 240 * MiB, "inference_step": 188 * MiB, "nccl": 262 * MiB},
    "file": "benchmarks/gpu_runs/h200-2026-11-27",
    "stage_sources": {"inference_step": "a real program, hf_generate, held 706 MiB outside the allocator "
                                        "(predict_vs_real.json)"},
}
MEASURED_SPREAD = 16 * MiB   # 11 real programs on the measured stack: each within -16/+6 MiB of the model
_SPREAD = {"architecture": 0.25, "card": 0.10, "cuda": 0.25, "eager": 0.5}   # shares added where not measured


# ============================================================================ what the program used
@dataclass(frozen=True)
class Used:
    """What the recorded run initialised (the session marks each on first use; run.py keeps it)."""
    cuda: bool = False       # any CUDA allocation: the process has a context
    cublas: bool = False     # a matmul (rules/cublas.py)
    cudnn: bool = False      # a convolution, batch norm or attention that cuDNN runs
    backward: bool = False   # a backward pass ran: a training step's kernels
    nccl: int = 0            # process groups on NCCL (each its own communicator)
    graphs: bool = False     # a CUDA graph was captured

    @classmethod
    def of(cls, libraries: dict | None) -> "Used":
        d = libraries or {}
        return cls(bool(d.get("cuda")), bool(d.get("cublas")), bool(d.get("cudnn")), bool(d.get("backward")),
                   int(d.get("nccl", 0)), bool(d.get("graphs")))

    def names(self) -> list[str]:
        return [n for n in ("cublas", "cudnn", "backward") if getattr(self, n)] + (["nccl"] if self.nccl else [])


@dataclass(frozen=True)
class Stack:
    """The software the prediction assumes the GPU machine runs: this machine's torch, its CUDA and
    cuDNN, and the environment's module loading."""
    module_loading: str = "lazy"   # "lazy" or "eager"
    cuda: str | None = None        # torch.version.cuda
    torch: str = ""

    @classmethod
    def here(cls, env: Any = None) -> "Stack":
        import torch

        env = os.environ if env is None else env
        cuda = torch.version.cuda
        eager = env.get("CUDA_MODULE_LOADING", "").upper() == "EAGER" or _before_lazy(cuda)
        return cls("eager" if eager else "lazy", cuda, torch.__version__)


def _before_lazy(cuda: str | None) -> bool:
    """CUDA before 11.7 has no lazy loading: every kernel loads when CUDA starts."""
    if not cuda:
        return False
    major, minor = (int(x) for x in (cuda.split(".") + ["0"])[:2])
    return (major, minor) < (11, 7)


# ============================================================================ the lines
@dataclass(frozen=True)
class Part:
    name: str          # what it is: "CUDA context (lazy loading)"
    nbytes: int
    label: str         # measured, documented, estimated or given
    source: str        # where the figure comes from


@dataclass(frozen=True)
class Outside:
    """Everything the process holds outside the caching allocator: its parts, their sum, how sure."""
    parts: tuple[Part, ...]
    uncertainty: int                      # bytes either way
    not_counted: tuple[str, ...] = ()     # what is outside the allocator and not in the parts
    basis: str = ""                       # one line: which measurement the parts come from

    @property
    def total(self) -> int:
        return sum(p.nbytes for p in self.parts)

    @property
    def label(self) -> str:
        """The weakest label of the parts (what the total as a whole is)."""
        order = (GIVEN, MEASURED, DOCUMENTED, ESTIMATED)
        return max((p.label for p in self.parts), key=order.index, default=GIVEN)

    def to_dict(self) -> dict:
        return {"bytes": self.total, "uncertainty": self.uncertainty, "label": self.label, "basis": self.basis,
                "parts": [{"part": p.name, "bytes": p.nbytes, "label": p.label, "source": p.source}
                          for p in self.parts],
                "not_counted": list(self.not_counted)}


def given(nbytes: int, how: str) -> Outside:
    """The user's own figure (--context-mb, or --capacity-gb's nothing): one line, no uncertainty."""
    parts = (Part("outside the caching allocator, as given", int(nbytes), GIVEN, how),) if nbytes else ()
    return Outside(parts, 0, (), how)


def outside_allocator(card: Any, used: Used, stack: Stack, calibration: dict | None = None) -> Outside:
    """The lines for a program that used `used` on `card` (name, capability) under `stack`, from the
    user's calibration entry for that card when there is one, else from BUILTIN."""
    if not used.cuda:
        return Outside((), 0, (), "no CUDA allocation: the process would start no CUDA context")
    entry = calibration or BUILTIN
    how, spread = _basis(card, entry, stack, calibration is not None)
    stage = _Stages(entry)
    parts = [Part("CUDA context (lazy loading)", int(entry["context"]), how.label, "stage 'context'")]
    if stack.module_loading == "eager":
        parts.append(Part("eager module loading: every kernel of torch (CUDA_MODULE_LOADING=EAGER)",
                          stage("context_eager"), how.label, "stage 'context_eager'"))
    parts += _libraries(used, stage, how)
    total = sum(p.nbytes for p in parts)
    return Outside(tuple(parts), MEASURED_SPREAD + int(spread * total), _not_counted(used), how.text)


@dataclass(frozen=True)
class _How:
    label: str
    text: str


def _basis(card: Any, entry: dict, stack: Stack, own: bool) -> tuple[_How, float]:
    """How the entry's figures apply to `card` under `stack`: their label and source, and the share
    of the total added to the uncertainty for what was not measured."""
    where = (f"{entry.get('device')}, driver {entry.get('driver')}, torch {entry.get('torch')} "
             f"(CUDA {entry.get('cuda')}), {entry.get('date')}")
    kept = "your calibration" if own else f"amem doctor --calibrate, kept in {entry.get('file', BUILTIN['file'])}"
    spread, why = 0.0, []
    if entry.get("device") != card.name:
        same_arch = tuple(card.capability)[:1] == tuple(entry.get("capability") or BUILTIN["capability"])[:1]
        spread += _SPREAD["card"] if same_arch else _SPREAD["architecture"]
        why.append(("another card of the same architecture" if same_arch else "another architecture") +
                   f" ({card.name})")
    if _major(stack.cuda) is not None and _major(stack.cuda) != _major(entry.get("cuda")):
        spread += _SPREAD["cuda"]
        why.append(f"CUDA {stack.cuda} here")
    if stack.module_loading == "eager":
        spread += _SPREAD["eager"]
        why.append("eager loading: the libraries' kernels then load whole, not measured")
    label = ESTIMATED if why else MEASURED
    text = f"{label}: {kept} ({where})" + (f"; applied to {', '.join(why)}" if why else "")
    return _How(label, text), spread


def _major(cuda: str | None) -> int | None:
    try:
        return int(str(cuda).split(".")[0]) if cuda else None
    except ValueError:
        return None


class _Stages:
    """The entry's stages (bytes beyond the context), BUILTIN's where the entry lacks one (a stage
    that failed on the user's machine, or one an older calibration did not measure)."""

    def __init__(self, entry: dict) -> None:
        self.entry = entry

    def __call__(self, name: str) -> int:
        got = (self.entry.get("beyond_context") or {}).get(name)
        return int(got if got is not None else BUILTIN["beyond_context"][name])

    def source(self, name: str) -> str:
        got = (self.entry.get("beyond_context") or {}).get(name)
        entry = self.entry if got is not None else BUILTIN
        own = (entry.get("stage_sources") or {}).get(name)
        return own or f"stage '{name}'" + ("" if got is not None or self.entry is BUILTIN else " (the built-in H200's)")


def _libraries(used: Used, stage: _Stages, how: _How) -> list[Part]:
    """cuBLAS, torch's kernels, cuDNN and NCCL: the largest stage the program went through, split."""
    name = "training_step" if used.backward else "inference_step"
    whole = stage(name)
    cublas = min(stage("cublas"), whole) if used.cublas else 0
    kernels = max(0, whole - stage("cublas"))
    step = "a training step" if used.backward else "an inference loop"
    parts = []
    if used.cublas:
        parts.append(Part("cuBLAS/cuBLASLt handles and kernels", cublas, how.label, stage.source("cublas")))
    parts.append(Part(f"torch's kernels, loaded on first launch ({step})", kernels, how.label,
                      f"{stage.source(name)}, less stage 'cublas'"))
    if used.cudnn:
        beyond = max(0, stage("cudnn") - cublas - kernels)
        parts.append(Part("cuDNN handle and kernels (beyond what is above)", beyond, how.label,
                          f"{stage.source('cudnn')}: {stage('cudnn') >> 20} MiB alone, less what is above"))
    if used.nccl:
        parts.append(Part("NCCL: its kernels and first communicator", stage("nccl"), how.label,
                          f"{stage.source('nccl')}, one rank"))
    return parts


def _not_counted(used: Used) -> tuple[str, ...]:
    out = []
    if used.nccl:
        out.append("NCCL's buffers for each peer and channel (NCCL_BUFFSIZE per connection) and "
                   + (f"{used.nccl - 1} more communicator(s) of other process groups" if used.nccl > 1
                      else "the peers' connections")
                   + ": measured with one rank only")
    if used.graphs:
        out.append("what the driver holds for each instantiated CUDA graph (its private pool is the allocator's, "
                   "in the reserved memory): not measured")
    out.append("kernels of custom CUDA extensions and of Triton (torch.compile): not modelled")
    return tuple(out)


# ============================================================================ defaults for a card
TRAINING = Used(cuda=True, cublas=True, backward=True)


def typical(card: Any) -> Outside:
    """A training step with cuBLAS under lazy loading on `card`: what a card's `context` is before
    a run says what it used (gpus.py's table; torch.cuda.mem_get_info while a script runs)."""
    return outside_allocator(card, TRAINING, Stack("lazy", BUILTIN["cuda"]))


def for_run(card: Any, libraries: dict | None, stack: Stack | None = None) -> Outside:
    """The lines for a recorded run on `card` (gpus.Gpu): the user's figure where the card carries
    one (--context-mb; --capacity-gb's device has none), else the model, from the card's
    calibration entry where it carries one."""
    if getattr(card, "context_given", None) is not None:
        return given(card.context_given, card.context_source)
    return outside_allocator(card, Used.of(libraries), stack or Stack.here(), getattr(card, "calibration", None))
