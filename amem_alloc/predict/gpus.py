"""The GPUs `amem predict --gpu NAME` knows: memory as torch reports it, compute capability, and
what the CUDA context takes before the caching allocator gets any of it.

Design note
-----------
`total_memory` is `torch.cuda.get_device_properties(i).total_memory`, which torch prints in MiB
(`total_memory=81082MB`). Where a printout of that line from a real card was found in public
code or docs, the figure is that reading (`memory_source` says "torch printout"); the same card
reads a few MiB differently under other drivers (81082 to 81090 MiB seen for the H100 SXM). Where
none was found, the figure is the card's nominal size less the typical 1.5% that the driver keeps
(`memory_source` says "estimate").

`context` is the device memory a process holds outside the caching allocator once it has run a
training step: the CUDA context with lazily loaded kernels (CUDA_MODULE_LOADING=LAZY, the
default since CUDA 11.7) and the cuBLAS/cuDNN handles' own state. cuBLAS's workspace is *not* in
it: torch takes that from the caching allocator, and the prediction records it there. No
measured figure per card was found, so every `context` is an estimate (`context_source`); pass
`--capacity-gb` to give the usable memory yourself.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..near_names import did_you_mean

MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class Gpu:
    key: str                  # what --gpu takes
    name: str                 # torch.cuda.get_device_name()
    total_memory: int         # bytes, as torch reports it
    capability: tuple[int, int]
    context: int              # bytes held outside the caching allocator (CUDA context, library handles)
    multi_processor_count: int
    memory_source: str
    context_source: str = "estimate"

    @property
    def usable(self) -> int:
        """What the caching allocator can reserve: total memory less the context."""
        return max(0, self.total_memory - self.context)

    @property
    def context_uncertainty(self) -> int:
        """How far off `usable` may be: the whole context where it is an estimate, none where the
        usable memory was given (--capacity-gb). The band is the estimate itself because nothing
        narrower is known: lazy loading keeps a context small, while others' A100 figures with an
        older stack were ~1.43 GB beyond reserved (1.66-1.95 GB with cuDNN) against 480 MiB here."""
        return self.context if self.context_source.startswith("estimate") else 0


def _nominal(gib: float) -> int:
    """An estimate of torch's figure from a card's nominal size (the driver keeps about 1.5%)."""
    return int(gib * GiB * 0.985) // MiB * MiB


_PRINTOUT = "torch printout"
_EST = "estimate (nominal size less 1.5%)"
_CTX_HOPPER = 560 * MiB   # estimates: context + handles after one training step, lazy loading
_CTX_AMPERE = 480 * MiB
_CTX_VOLTA = 400 * MiB

GPUS: dict[str, Gpu] = {g.key: g for g in (
    Gpu("H100-80GB", "NVIDIA H100 80GB HBM3", 81082 * MiB, (9, 0), _CTX_HOPPER, 132, _PRINTOUT),
    Gpu("H100-PCIe", "NVIDIA H100 PCIe", 81008 * MiB, (9, 0), _CTX_HOPPER, 114, _PRINTOUT),
    Gpu("H100-NVL", "NVIDIA H100 NVL", _nominal(94), (9, 0), _CTX_HOPPER, 132, _EST),
    Gpu("H200", "NVIDIA H200", 143156 * MiB, (9, 0), _CTX_HOPPER, 132, _PRINTOUT),
    Gpu("B200", "NVIDIA B200", _nominal(180), (10, 0), _CTX_HOPPER, 148, _EST),
    Gpu("A100-40GB", "NVIDIA A100-SXM4-40GB", 40536 * MiB, (8, 0), _CTX_AMPERE, 108, _PRINTOUT),
    Gpu("A100-80GB", "NVIDIA A100-SXM4-80GB", 81920 * MiB, (8, 0), _CTX_AMPERE, 108, _PRINTOUT),
    Gpu("L40S", "NVIDIA L40S", 45589 * MiB, (8, 9), _CTX_AMPERE, 142, _PRINTOUT),
    Gpu("L4", "NVIDIA L4", _nominal(24) - 512 * MiB, (8, 9), _CTX_AMPERE, 58,
        "estimate (nominal 24 GB less the ECC reserve and 1.5%)"),
    Gpu("A10G", "NVIDIA A10G", 22587 * MiB, (8, 6), _CTX_AMPERE, 80, _PRINTOUT),
    Gpu("RTX-4090", "NVIDIA GeForce RTX 4090", 24563 * MiB, (8, 9), _CTX_AMPERE, 128, _PRINTOUT),
    Gpu("RTX-3090", "NVIDIA GeForce RTX 3090", 24259 * MiB, (8, 6), _CTX_AMPERE, 82, _PRINTOUT),
    Gpu("V100-16GB", "Tesla V100-SXM2-16GB", 16160 * MiB, (7, 0), _CTX_VOLTA, 80, _PRINTOUT),
    Gpu("V100-32GB", "Tesla V100-SXM2-32GB", _nominal(32), (7, 0), _CTX_VOLTA, 80, _EST),
)}
DEFAULT = "H100-80GB"
ALIASES = {"H100": "H100-80GB", "H100-SXM": "H100-80GB", "A100": "A100-80GB", "4090": "RTX-4090",
           "3090": "RTX-3090", "V100": "V100-32GB"}


def _norm(text: str) -> str:
    """A card's name as compared: case, spaces, `-` and `_` do not matter (RTX4090 is RTX-4090)."""
    return text.strip().upper().replace("_", "").replace(" ", "").replace("-", "")


def get(name: str) -> Gpu:
    """The card called `name` (case and -/_ do not matter); ValueError naming the choices."""
    wanted = _norm(name)
    wanted = _norm(ALIASES.get(wanted, wanted))
    for key, gpu in GPUS.items():
        if _norm(key) == wanted:
            return gpu
    near = did_you_mean(name, [*GPUS, *ALIASES])
    raise ValueError(f"unknown GPU {name!r}{near}; choose one of {', '.join(GPUS)} (or give --capacity-gb N)")


def custom(capacity_gb: float) -> Gpu:
    """A device of `capacity_gb` GiB that the caching allocator may use entirely (no context taken)."""
    if isinstance(capacity_gb, bool) or not isinstance(capacity_gb, (int, float)) or not capacity_gb * GiB >= 1 \
            or capacity_gb > 1 << 20:   # under one byte: no device to judge against (replay/evaluation.py)
        raise ValueError(f"capacity must be a positive number of GiB, got {capacity_gb!r}")
    total = int(capacity_gb * GiB)
    return Gpu(f"{capacity_gb:g}GB", f"a {capacity_gb:g} GiB device", total, (9, 0), 0, 132,
               "given with --capacity-gb", "none: --capacity-gb is the usable memory")


def describe() -> str:
    """The table as text (amem predict --help, docs)."""
    rows = [f"{g.key:<10} {g.name:<26} {g.total_memory / GiB:7.1f} GiB  sm_{g.capability[0]}{g.capability[1]}  "
            f"context ~{g.context / MiB:.0f} MiB" for g in GPUS.values()]
    return "\n".join(rows)
