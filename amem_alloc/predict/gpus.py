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

`context` is the device memory a process holds outside the caching allocator: the CUDA context
and the libraries' own memory, line by line in context.py. A card's entry holds what a training
step with cuBLAS holds under lazy loading (context.typical), which torch.cuda.mem_get_info answers
from while a script runs; a prediction replaces it with the figure for what the run used
(analysis/prediction.py). cuBLAS's workspace is *not* in it: torch takes that from the caching
allocator, and the prediction records it there. The user can give the figure (`with_context`:
--context-mb) or a calibration file measured on the card (`with_calibration`: amem doctor
--calibrate); `--capacity-gb` gives the usable memory itself.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import context as context_mod

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
    context_given: int | None = None    # bytes the user gave (--context-mb); 0 for --capacity-gb's device
    calibration: Any = field(default=None, compare=False)   # the user's calibration entry for this card
    # how far off `context` may be, either way (context.py's model for what was not measured; 0 where
    # the user gave the figure, or --capacity-gb the usable memory): the verdict's borderline band
    context_uncertainty: int = 0

    @property
    def usable(self) -> int:
        """What the caching allocator can reserve: total memory less the context."""
        return max(0, self.total_memory - self.context)


def _nominal(gib: float) -> int:
    """An estimate of torch's figure from a card's nominal size (the driver keeps about 1.5%)."""
    return int(gib * GiB * 0.985) // MiB * MiB


_PRINTOUT = "torch printout"
_EST = "estimate (nominal size less 1.5%)"


def _card(key: str, name: str, total: int, capability: tuple[int, int], sms: int, memory_source: str) -> Gpu:
    """A card of the table, its context what a training step holds there (context.typical)."""
    card = Gpu(key, name, total, capability, 0, sms, memory_source)
    typical = context_mod.typical(card)
    return replace(card, context=typical.total, context_source=typical.basis, context_uncertainty=typical.uncertainty)


GPUS: dict[str, Gpu] = {g.key: g for g in (
    _card("H100-80GB", "NVIDIA H100 80GB HBM3", 81082 * MiB, (9, 0), 132, _PRINTOUT),
    _card("H100-PCIe", "NVIDIA H100 PCIe", 81008 * MiB, (9, 0), 114, _PRINTOUT),
    _card("H100-NVL", "NVIDIA H100 NVL", _nominal(94), (9, 0), 132, _EST),
    _card("H200", "NVIDIA H200", 143156 * MiB, (9, 0), 132, _PRINTOUT),
    _card("B200", "NVIDIA B200", _nominal(180), (10, 0), 148, _EST),
    _card("A100-40GB", "NVIDIA A100-SXM4-40GB", 40536 * MiB, (8, 0), 108, _PRINTOUT),
    _card("A100-80GB", "NVIDIA A100-SXM4-80GB", 81920 * MiB, (8, 0), 108, _PRINTOUT),
    _card("L40S", "NVIDIA L40S", 45589 * MiB, (8, 9), 142, _PRINTOUT),
    _card("L4", "NVIDIA L4", _nominal(24) - 512 * MiB, (8, 9), 58,
          "estimate (nominal 24 GB less the ECC reserve and 1.5%)"),
    _card("A10G", "NVIDIA A10G", 22587 * MiB, (8, 6), 80, _PRINTOUT),
    _card("RTX-4090", "NVIDIA GeForce RTX 4090", 24563 * MiB, (8, 9), 128, _PRINTOUT),
    _card("RTX-3090", "NVIDIA GeForce RTX 3090", 24259 * MiB, (8, 6), 82, _PRINTOUT),
    _card("V100-16GB", "Tesla V100-SXM2-16GB", 16160 * MiB, (7, 0), 80, _PRINTOUT),
    _card("V100-32GB", "Tesla V100-SXM2-32GB", _nominal(32), (7, 0), 80, _EST),
)}
DEFAULT = "H100-80GB"
ALIASES = {"H100": "H100-80GB", "H100-SXM": "H100-80GB", "H100-SXM5": "H100-80GB", "A100": "A100-80GB",
           "A100-SXM": "A100-80GB", "A100-SXM4": "A100-80GB", "4090": "RTX-4090", "3090": "RTX-3090",
           "V100": "V100-32GB"}


def _norm(text: str) -> str:
    """A card's name as compared: case, spaces, `-` and `_` do not matter (RTX4090 is RTX-4090)."""
    return text.strip().upper().replace("_", "").replace(" ", "").replace("-", "")


_ALIAS_OF = {_norm(alias): card for alias, card in ALIASES.items()}   # compared as names are


def get(name: str) -> Gpu:
    """The card called `name` (case and -/_ do not matter); ValueError naming the choices."""
    wanted = _norm(name)
    wanted = _norm(_ALIAS_OF.get(wanted, wanted))
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
               "given with --capacity-gb", "none: --capacity-gb is the usable memory", context_given=0)


def with_context(card: Gpu, context_mb: float | None) -> Gpu:
    """`card` with the memory held outside the caching allocator given by the user (--context-mb:
    the CUDA context and the libraries together, as nvidia-smi less torch's reserved memory shows it)."""
    if context_mb is None:
        return card
    if isinstance(context_mb, bool) or not isinstance(context_mb, (int, float)) or not 0 <= context_mb < card.total_memory / MiB:
        raise ValueError(f"--context-mb must be a number of MiB from 0 to under the card's "
                         f"{card.total_memory / MiB:.0f}, got {context_mb!r}")
    if card.context_given is not None and card.context_source.startswith("none"):
        raise ValueError("give --capacity-gb (the usable memory itself) or --context-mb, not both")
    nbytes = int(context_mb * MiB)
    return replace(card, context=nbytes, context_source=f"given with --context-mb {context_mb:g}", context_given=nbytes,
                   context_uncertainty=0)


def with_calibration(card: Gpu, path: str | Path | None = None) -> Gpu:
    """`card` with the user's calibration entry for it (amem doctor --calibrate's file: `path`, else
    $AMEM_CALIBRATION, else the default place), which every prediction for it then uses; the card
    as it is where the file has none for it (or --context-mb/--capacity-gb already said)."""
    from .. import calibration

    if card.context_given is not None:
        return card
    if path is not None and not Path(path).is_file():
        raise ValueError(f"{path}: no such calibration file (amem doctor --calibrate writes one on a GPU machine)")
    entry = calibration.for_device(card.name, Path(path) if path is not None else None)
    if entry is None or entry.get("context") is None:
        return card
    entry = dict(entry, file=str(path or calibration.calibration_path()))
    typical = context_mod.outside_allocator(card, context_mod.TRAINING, context_mod.Stack("lazy", entry.get("cuda")),
                                            entry)
    return replace(card, context=typical.total, context_source=typical.basis, calibration=entry,
                   context_uncertainty=typical.uncertainty)


def describe() -> str:
    """The table as text (amem predict --help, docs)."""
    rows = [f"{g.key:<10} {g.name:<26} {g.total_memory / GiB:7.1f} GiB  sm_{g.capability[0]}{g.capability[1]}  "
            f"outside the allocator ~{g.context / MiB:.0f} MiB" for g in GPUS.values()]
    return "\n".join(rows + ["(outside the allocator: the CUDA context and libraries after a training step with cuBLAS, "
                              "lazy loading; each prediction takes what its run used)"])
