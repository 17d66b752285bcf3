"""amem_alloc.provenance(tensor): one record of everything known about a tensor's storage.

The tracers of this process are asked newest first; the first that made the storage answers.
A tensor no tracer made still gets a record: its dtype, shape, storage and block (from the
allocator where amem made it), its category where a tracer knows it (a parameter, an input),
and notes that say what is not known and why.
"""
from __future__ import annotations

import weakref

import torch

from .accounting import block_of, segment_of, storage_of
from .classify import category, module_label
from .dispatch import _dtype_name

_TRACERS: list = []  # weak references, oldest first


def register(tracer) -> None:
    _TRACERS[:] = [r for r in _TRACERS if r() is not None]
    _TRACERS.append(weakref.ref(tracer))


def tracers() -> list:
    """The tracers still alive, newest first."""
    return [t for t in (r() for r in reversed(_TRACERS)) if t is not None]


class Provenance:
    """Where one tensor's storage came from. Every field is JSON-ready; see to_dict()."""

    FIELDS = ("dtype", "shape", "device", "tensor_bytes", "storage_bytes", "address", "block_size",
              "requested_bytes", "allocator", "exact_size", "segment", "stream", "seq", "time_ns",
              "alloc_seq", "op", "module", "phase", "category", "what", "saved_by", "grad_node",
              "grad_node_module", "recompute", "stack", "traced", "freed", "notes")

    def __init__(self, **fields):
        for name in self.FIELDS:
            setattr(self, name, fields.get(name))
        self.notes = fields.get("notes") or []
        self.saved_by = fields.get("saved_by") or []

    @property
    def saved_by_labels(self) -> list[str]:
        """["AddmmBackward0.mat1", ...]."""
        return [s["label"] for s in self.saved_by]

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.FIELDS}

    def __repr__(self) -> str:
        return (f"<Provenance {self.dtype}{self.shape} {self.category} from {self.op} in "
                f"{module_label(self.module) if self.traced else '?'} ({self.phase})>")

    def __str__(self) -> str:
        from .report import provenance_text

        return provenance_text(self.to_dict())


def _saved_row(slot) -> dict:
    return {"label": slot.label, "node": slot.node.name if slot.node is not None else None, "slot": slot.slot,
            "module": slot.owner_module, "state": slot.state, "step": slot.step + 1}


def _block_fields(block) -> dict:
    return {"address": block.address, "block_size": block.size, "requested_bytes": block.requested,
            "allocator": block.allocator, "exact_size": block.exact, "stream": block.stream,
            "alloc_seq": block.alloc_seq}


def _record_fields(rec, tracer) -> dict:
    t0 = tracer.started_ns or rec.time_ns
    return {"seq": rec.seq, "time_ns": rec.time_ns - t0, "op": rec.op, "module": rec.module,
            "phase": rec.phase, "grad_node": rec.grad_node, "grad_node_module": rec.grad_node_module,
            "recompute": rec.recompute, "stack": rec.stack, "freed": not rec.alive,
            "saved_by": [_saved_row(s) for s in rec.saved_by]}


def _notes(fields: dict, rec) -> list[str]:
    notes = []
    alloc = fields["allocator"]
    if alloc == "cpu":
        notes.append("a CPU tensor: amem allocates CUDA memory only; block_size is what the 512-byte "
                     "rounding would make it on a GPU")
    elif alloc == "native":
        notes.append("amem is not torch's CUDA allocator in this process: block_size is the rounding")
    elif alloc == "amem-unknown":
        notes.append("amem did not allocate this tensor (no amem block at its address: made before "
                     "amem_alloc.enable(), or by another allocator); block_size is the rounding")
    if rec is None:
        notes.append("no tracer saw this storage being made: its op, module, phase and time are unknown")
    for s in fields["saved_by"]:
        if s["state"] == "released":
            notes.append(f"saved by {s['label']} until backward freed it")
        elif s["state"] == "other_hooks":
            notes.append(f"saved by {s['label']} through other saved_tensors_hooks (checkpoint, offloading)")
    return notes


def _find(key, storage, tracer):
    """(the tracer that made the storage, its record); else (the newest tracer, None)."""
    candidates = [tracer] if tracer is not None else tracers()
    for tr in candidates:
        rec = tr.table.find(key, storage)
        if rec is not None:
            return tr, rec
    return (candidates[0] if candidates else None), None


def provenance(tensor, tracer=None) -> Provenance:
    """Everything known about where tensor's storage came from (see Provenance.FIELDS)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"provenance() takes a torch.Tensor, not {type(tensor).__name__}")
    fields = {"dtype": _dtype_name(tensor.dtype), "shape": list(tensor.shape), "device": str(tensor.device),
              "tensor_bytes": tensor.numel() * tensor.element_size(), "saved_by": [], "traced": False}
    facts = storage_of(tensor)
    if facts is None:
        fields["notes"] = ["this tensor has no plain storage (sparse, nested or meta): no block to report"]
        return Provenance(**fields)
    storage, key, nbytes = facts
    tr, rec = _find(key, storage, tracer)
    fields["storage_bytes"] = nbytes
    fields.update(_block_fields(rec.block if rec is not None else block_of(key[1], nbytes, key[0])))
    fields["segment"] = segment_of(key[1], key[0])
    if rec is not None:
        fields.update(_record_fields(rec, tr), traced=True)
    if tr is not None:
        know = tr.knowledge()
        fields["category"] = category(key, rec, know)
        fields["what"] = _what(key, rec, know)
    fields["notes"] = _notes(fields, rec)
    return Provenance(**fields)


def _what(key, rec, know) -> str:
    from .classify import describe

    return describe(key, rec, know, rec.dtype if rec is not None else "")
