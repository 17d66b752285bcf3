"""Graph capture: which autograd node saved which tensor, in which slot, and what it holds.

Saving. While a tracer runs, its pack/unpack pair is torch's default saved_tensors_hooks (the
public torch.autograd.graph.saved_tensors_hooks). pack receives every tensor autograd saves
outside other hooks -- node slots, and SavedTensors held elsewhere, such as the inputs
torch.utils.checkpoint keeps -- and returns a small handle that keeps the tensor (nothing is
copied; unpack returns it unchanged). The handle's finalizer records when backward frees it.
Inside checkpoint, save_on_cpu or any other saved_tensors_hooks, their hooks are innermost and
pack is not called: those tensors are theirs.

Naming. Nodes are found as they are made: the dispatch mode queues each op's outputs, and at the
next op their grad_fn is the node the op made. If our hooks were innermost when that op ran, the
node's slots are read (`_saved_<slot>`, `saved_tensors`): each read calls our unpack with the
handle, which names it node.slot. Otherwise a slot is never unpacked -- unpacking a checkpoint's
slot would recompute its forward -- only probed with SavedTensor.register_hooks, which torch
refuses for a slot that has hooks (listed as held by other hooks) and accepts for one that has
none (then captured the same way). From each new node the walk follows next_functions to nodes it
has not seen, and stops at nodes made before the tracer started.
"""
from __future__ import annotations

import sys

from .accounting import block_of, device_name
from .records import NodeRecord, SlotRecord, next_seq, now_ns
from .scope import _task_id

_NOT_A_NODE_SEQ = 2**64 - 1  # AccumulateGrad and other graph leaves
_SLOT_NAMES: dict = {}
_MISSING = object()


def slot_names(node) -> tuple:
    """The saved-tensor slots of a node's class ("mat1", "result"; "tensors" for custom Functions)."""
    cls = type(node)
    names = _SLOT_NAMES.get(cls)
    if names is None:
        names = _SLOT_NAMES[cls] = tuple(a[len("_raw_saved_"):] for a in dir(node) if a.startswith("_raw_saved_"))
    return names


def _holder_of_caller() -> str | None:
    """"checkpoint" when torch.utils.checkpoint is saving its inputs, else None."""
    f = sys._getframe(2)
    for _ in range(3):
        if f is None:
            return None
        code = f.f_code
        if code.co_name == "save_inputs" and code.co_filename.endswith("checkpoint.py"):
            return "checkpoint"
        f = f.f_back
    return None


class _Held:
    """What a saved slot holds instead of its tensor: the tensor, and its SlotRecord."""

    __slots__ = ("tensor", "slot")

    def __init__(self, tensor, slot):
        self.tensor, self.slot = tensor, slot

    def __del__(self):
        slot = self.slot
        if slot is not None:
            slot.state, slot.released_seq, slot.released_ns = "released", next_seq(), now_ns()


def _fill(slot: SlotRecord, tensor, tracer) -> None:
    """The facts of a saved tensor, taken while it is sure to be alive (sizes and sentences are
    made from them when a report asks)."""
    slot.state, slot.dtype, slot.shape = "held", tensor.dtype, tensor.shape
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):  # sparse, nested: no plain storage
        slot.what = "a tensor without a plain storage (sparse, nested)"
        return
    ptr = storage.data_ptr()
    slot.device, slot.nbytes = device_name(tensor.device), storage.nbytes()
    if ptr:
        key = slot.key = (slot.device, ptr)
        rec = slot.alloc = tracer.table.find(key, storage)
        if rec is not None:
            rec.add_saver(slot)
        elif tracer.exact_blocks and slot.device.startswith("cuda"):
            slot.block = block_of(ptr, slot.nbytes, slot.device)  # amem's block, while it is this one's
        slot.state_of, slot.is_input = tracer.know.model_state.get(key), tracer.is_input(key, storage)


def _refusal(message: str) -> str | None:
    """What register_hooks' refusal says about a slot: None when the node saved nothing there."""
    if "already" in message:
        return "other_hooks"
    if "freed" in message:
        return "released"
    return None if "None" in message else "unreadable"


def _refused_slot(state: str, owner, message: str) -> tuple[str, str]:
    """(state, detail) of a slot that register_hooks refused."""
    if state != "other_hooks":
        return state, message.split(". ")[0]
    if owner is None:
        return "unknown_hooks", "saved through hooks that could not be identified: not read"
    if owner == "checkpoint":
        return state, "checkpointed: not kept, recomputed in backward"
    if owner == "other":
        return state, "held by other saved_tensors_hooks (checkpoint, offloading): not read"
    return state, f"held by {owner}'s saved_tensors_hooks: not read"


class GraphCapture:
    def __init__(self, start_seq: int, tracer):
        self.start = start_seq
        self.nodes: dict = {}           # autograd sequence number -> NodeRecord
        self.steps: list = [[]]         # NodeRecords per forward/backward step; the last is open
        self.saved: list = [[]]         # SlotRecords packed per step (named or not)
        self._tracer = tracer           # its scope (module now), table (allocations), know (model)
        self._reading = None            # handles unpacked while a slot is read
        self.default_owner = None       # whose hooks hold slots of nodes found by the walk (None: unknown)
        self.pack, self.unpack = self._pack, self._unpack  # one bound object each: identity = ours

    def close_step(self) -> None:
        """A backward began: the nodes made so far form one step."""
        if self.steps[-1] or self.saved[-1]:
            self.steps.append([])
            self.saved.append([])

    # ------------------------------------------------------------ hooks ------------------------
    def _pack(self, tensor):
        if _task_id() != -1:            # recomputation or double backward: not this step's graph
            return _Held(tensor, None)
        tracer = self._tracer
        slot = SlotRecord(tracer.scope.module, len(self.steps) - 1, _holder_of_caller())
        _fill(slot, tensor, tracer)
        self.saved[-1].append(slot)
        return _Held(tensor, slot)

    def _unpack(self, held: _Held):
        if self._reading is not None:
            self._reading.append(held)
        return held.tensor

    # ------------------------------------------------------------ nodes ------------------------
    def discover(self, fn, module, ours) -> None:
        """Records fn (the grad_fn of an op's output) and the unseen nodes behind it. ours: True if
        our hooks were innermost when the op ran; else the name of the hooks that were, or None
        when unknown."""
        found, todo = "op output", [fn]
        while todo:
            node = todo.pop()
            seq = node._sequence_nr()
            if seq < self.start or seq >= _NOT_A_NODE_SEQ or seq in self.nodes:
                continue
            rec = NodeRecord(seq, node.name(), module, len(self.steps) - 1, found)
            self.nodes[seq] = rec
            self.steps[-1].append(rec)
            self._read(node, rec) if ours is True else self._probe(node, rec, ours)
            todo.extend(f for f, _ in node.next_functions if f is not None)
            found, ours = "graph walk", self.default_owner

    def _read(self, node, rec: NodeRecord) -> None:
        for name in slot_names(node):
            self._reading = []
            try:
                value = getattr(node, "saved_tensors" if name == "tensors" else "_saved_" + name)
            except RuntimeError as err:  # modified in place since it was saved, or already freed
                value, rec.detail = None, str(err).split(". ")[0]
            finally:
                got, self._reading = self._reading, None
            label = "saved_tensors" if name == "tensors" else name
            indexed = isinstance(value, (list, tuple))
            for i, held in enumerate(got):
                self._claim(held, rec, f"{label}[{i}]" if indexed else label)
        if rec.slots:  # where the node saved its tensors: a custom Function's caller, not its last op
            rec.module = rec.slots[0].module

    def _probe(self, node, rec: NodeRecord, ours) -> None:
        for name in slot_names(node):
            try:
                raw = getattr(node, "_raw_saved_" + name)
            except RuntimeError:
                continue
            label = "saved_tensors" if name == "tensors" else name
            items = list(enumerate(raw)) if isinstance(raw, (list, tuple)) else [(None, raw)]
            for i, item in items:
                if item is not None:
                    self._probe_one(rec, label if i is None else f"{label}[{i}]", item, ours)

    def _probe_one(self, rec: NodeRecord, label: str, raw, ours) -> None:
        if getattr(raw, "unpack_hook", _MISSING) is self.unpack:  # newer torch tells whose hooks
            self._claim(raw.data, rec, label)
            return
        before = len(self.saved[-1])  # a slot without hooks: register_hooks packs it at once
        try:
            raw.register_hooks(self.pack, self.unpack)  # accepted only where the slot has no hooks
        except RuntimeError as err:
            state = _refusal(str(err))
            if state is not None:
                slot = SlotRecord(rec.module, rec.step, None)
                slot.state, slot.detail = _refused_slot(state, ours, str(err))
                slot.what = slot.detail
                self._claim_record(slot, rec, label)
            return
        if len(self.saved[-1]) > before:
            self._claim_record(self.saved[-1][-1], rec, label)

    def _claim(self, held, rec: NodeRecord, label: str) -> None:
        slot = getattr(held, "slot", None)
        if slot is not None and slot.node is None:
            self._claim_record(slot, rec, label)

    @staticmethod
    def _claim_record(slot, rec: NodeRecord, label: str) -> None:
        slot.node, slot.slot = rec, label
        rec.slots.append(slot)
