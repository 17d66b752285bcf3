"""Activation memory of one step: per saved tensor, per autograd node, per module, and in total.

Counting rules (docs/provenance.md):
  - a storage counts once: the first node that saved it (creation order) owns its bytes; every
    other slot that saved a view of it says "shared with <that slot>" and adds nothing;
  - parameters and buffers saved by a node are model state, not activation memory: listed, not
    counted; an autocast copy of a parameter is a new storage, and counts;
  - slots held by other saved_tensors_hooks (checkpoint, offloading) are listed and not counted:
    checkpoint keeps nothing there (it recomputes), offloading keeps the copy in host memory;
  - nominal bytes are the storage's nbytes; allocator bytes are its block (accounting.py);
  - a module's "self" figures count the nodes its own forward made; "total" adds its submodules.
"""
from __future__ import annotations

from .accounting import block_of
from .classify import describe_saved, module_label
from .dispatch import _dtype_name
from .module_paths import module_order
from .records import MODEL_STATE_KINDS
from .report import activations_text

_ACCOUNTING = {
    "cpu": "CPU tensors: nominal bytes, and allocator bytes as torch's CUDA caching allocator would "
           "round them on a GPU (512-byte rounding)",
    "amem": "CUDA tensors allocated by amem: allocator bytes are the real block sizes",
    "native": "CUDA tensors under torch's own allocator: allocator bytes are its rounding of the request",
    "amem-unknown": "CUDA tensors amem did not allocate: allocator bytes are the rounding",
}


def _acc() -> dict:
    return {"nominal_bytes": 0, "allocator_bytes": 0, "storages": 0}


def _add(acc: dict, row: dict) -> None:
    acc["nominal_bytes"] += row["nominal_bytes"]
    acc["allocator_bytes"] += row["allocator_bytes"]
    acc["storages"] += 1


def _ancestors(path):
    """'layers.3.fc1' -> 'layers.3.fc1', 'layers.3', 'layers', '' (the model)."""
    if path is None:
        return [None]
    parts = path.split(".") if path else []
    return [".".join(parts[:i]) for i in range(len(parts), -1, -1)]


def _facts(slot) -> tuple:
    """(dtype name, shape, tensor bytes, Block, kind, what) of a SlotRecord, made now."""
    if slot.dtype is None:  # not read: held by other hooks
        return None, None, 0, None, "unknown", slot.what or slot.detail or ""
    dtype = _dtype_name(slot.dtype)
    shape = list(slot.shape)
    numel = 1
    for d in shape:
        numel *= d
    if slot.alloc is not None:
        block = slot.alloc.block
    else:
        block = slot.block or (block_of(slot.key[1], slot.nbytes, slot.device) if slot.key else None)
    if slot.device is None:  # no plain storage
        return dtype, shape, numel * slot.dtype.itemsize, None, "unknown", slot.what
    kind, what = describe_saved(slot.state_of, slot.is_input, slot.alloc, dtype)
    return dtype, shape, numel * slot.dtype.itemsize, block, kind, what


def _slot_row(slot) -> dict:
    alloc, node = slot.alloc, slot.node
    dtype, shape, tensor_bytes, block, kind, what = _facts(slot)
    return {
        "node": node.name if node is not None else None, "node_seq": node.seq if node is not None else None,
        "slot": slot.slot, "label": slot.label, "holder": slot.holder,
        "module": slot.owner_module, "state": slot.state, "dtype": dtype, "shape": shape,
        "kind": kind, "what": what, "nominal_bytes": slot.nbytes, "tensor_bytes": tensor_bytes,
        "allocator_bytes": block.size if block is not None else 0,
        "exact": block.exact if block is not None else False,
        "allocator": block.allocator if block is not None else None,
        "storage": list(slot.key) if slot.key is not None else None,
        "alloc_seq": alloc.seq if alloc is not None else None,
        "counted": False, "note": slot.detail or "",
    }


class _Counter:
    """Walks one step's slots in node order and decides, per slot, whether its bytes count."""

    def __init__(self):
        self.owner: dict = {}            # storage key -> label of the slot that counts it
        self.total, self.model_state = _acc(), _acc()
        self.by_kind: dict = {}
        self.module_self: dict = {}
        self.other_hooks: list = []

    def visit(self, slot, row: dict, node_acc: dict) -> None:
        if slot.state not in ("held", "released") or slot.dtype is None:
            row["note"] = row["note"] or "not read"
            self.other_hooks.append(slot.label)
        elif row["kind"] in MODEL_STATE_KINDS:
            row["note"] = "model state, not activation memory"
            _add(self.model_state, row)
        elif slot.key is not None and slot.key in self.owner:
            row["note"] = f"shared with {self.owner[slot.key]}"
        elif slot.nbytes == 0:
            row["note"] = "0 bytes: no block"
        else:
            if slot.key is not None:
                self.owner[slot.key] = slot.label
            row["counted"] = True
            for acc in (self.total, node_acc, self.by_kind.setdefault(row["kind"], _acc()),
                        self.module_self.setdefault(slot.owner_module, _acc())):
                _add(acc, row)

    def modules(self) -> list[dict]:
        totals: dict = {}
        for path, acc in self.module_self.items():
            for anc in _ancestors(path):
                t = totals.setdefault(anc, _acc())
                for k in t:
                    t[k] += acc[k]
        order = sorted(totals, key=module_order)
        return [{"module": p, "label": module_label(p), "self": self.module_self.get(p, _acc()), "total": totals[p]}
                for p in order]


def _status(nodes, rows, hooks_mode) -> tuple[str, str]:
    if not nodes and not rows:
        return "empty", ("no autograd node was made inside this tracer: the forward ran under torch.no_grad() "
                         "or inference_mode, nothing in it requires grad, or it ran before the tracer started")
    held = [r for r in rows if r["state"] in ("held", "released")]
    if not held:
        why = {"outer": "saved_tensors_hooks (e.g. save_on_cpu) were active before the tracer started, and the "
                        "saved tensors are theirs"}.get(hooks_mode, "only through other saved_tensors_hooks")
        return "nothing saved", f"no saved tensor could be read: the graph saved none, or {why}"
    released = sum(r["state"] == "released" for r in held)
    if released == len(held):
        return "freed", ("backward has freed the saved tensors of this step: these figures are what the graph "
                         "held when its backward began")
    if released:
        return "partly freed", f"backward has freed {released} of {len(held)} saved tensors; figures are as captured"
    return "live", "the saved tensors are alive now"


def build(steps: list, step: int | None, model=None, hooks_mode=None) -> "ActivationReport":
    """The report for steps[step - 1] (None: the last one); a step is (nodes, saved slots)."""
    if step is not None and not 1 <= step <= len(steps):
        raise IndexError(f"activations(step={step}): this tracer has {len(steps)} steps"
                         + (f" (1..{len(steps)})" if steps else ": it saw no autograd graph"))
    step = len(steps) if step is None else step
    nodes, saved = steps[step - 1] if steps else ([], [])
    nodes = sorted(nodes, key=lambda n: n.seq)
    slots = [s for n in nodes for s in n.slots] + [s for s in saved if s.node is None]
    counter, rows, node_accs = _Counter(), [], {n.seq: _acc() for n in nodes}
    for slot in sorted(slots, key=lambda s: s.captured_seq):  # the first save of a storage owns it
        row = _slot_row(slot)
        counter.visit(slot, row, node_accs[slot.node.seq] if slot.node is not None else _acc())
        rows.append(row)
    node_rows = [{"node": n.name, "seq": n.seq, "module": n.module, "found": n.found,
                  "slots": [s.slot for s in n.slots], **node_accs[n.seq]} for n in nodes]
    status, message = _status(nodes, rows, hooks_mode)
    allocators = sorted({r["allocator"] for r in rows if r["allocator"]})
    return ActivationReport({
        "step": step if steps else 0, "steps": len(steps), "status": status, "message": message,
        "model": type(model).__name__ if model is not None else None, "hooks": hooks_mode,
        "accounting": [_ACCOUNTING.get(a, a) for a in allocators],
        "total": counter.total, "by_kind": counter.by_kind, "model_state_saved": counter.model_state,
        "held_by_other_hooks": {"tensors": len(counter.other_hooks), "slots": counter.other_hooks},
        "modules": counter.modules(), "nodes": node_rows, "saved": rows,
    })


class ActivationReport:
    """One step's activation memory. .to_dict() is JSON-ready; str() is the readable table."""

    def __init__(self, data: dict):
        self.data = data

    def to_dict(self) -> dict:
        return self.data

    def __getitem__(self, key):
        return self.data[key]

    @property
    def total(self) -> dict:
        return self.data["total"]

    @property
    def saved(self) -> list[dict]:
        return self.data["saved"]

    @property
    def nodes(self) -> list[dict]:
        return self.data["nodes"]

    @property
    def status(self) -> str:
        return self.data["status"]

    @property
    def message(self) -> str:
        return self.data["message"]

    def module(self, path) -> dict:
        """The {"self", "total"} figures of a module path ("" = the model, None = outside it)."""
        for m in self.data["modules"]:
            if m["module"] == path:
                return m
        return {"module": path, "label": module_label(path), "self": _acc(), "total": _acc()}

    def __str__(self) -> str:
        return activations_text(self.data)

    def __repr__(self) -> str:
        t = self.total
        return (f"<ActivationReport step {self.data['step']}/{self.data['steps']} {self.status}: "
                f"{t['nominal_bytes']} nominal, {t['allocator_bytes']} allocator bytes in {t['storages']} storages>")
