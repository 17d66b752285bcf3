"""Records: what a Tracer keeps per allocation, per autograd node and per saved tensor.

The tracer makes one AllocRecord for every new storage an op returns and one SlotRecord for every
tensor autograd saves, so both must be cheap to make: their rarely set fields are class-level
defaults, and __init__ sets only what every record has. Everything here is data; the modules
that fill the records (dispatch, graph) and read them (classify, activations, lookup) hold the
logic.

Sequence numbers and times come from one process-wide counter and clock (perf_counter_ns), so
records of several tracers still order correctly against each other.
"""
from __future__ import annotations

import itertools
import time

from ..categories import TRACER_CATEGORIES

PHASES = ("forward", "backward", "optimizer", "other")
# torch.profiler._memory_profiler.Category, in lower case; None where none of them fits.
CATEGORIES = TRACER_CATEGORIES   # the profiler's categories (amem_alloc/categories.py: one table)
# What a saved tensor is (SlotRecord.kind). Parameters and buffers are model state, not activations.
MODEL_STATE_KINDS = ("parameter", "buffer")

next_seq = itertools.count(1).__next__   # the process's allocation/event sequence number
now_ns = time.perf_counter_ns


# ---------------------------------------------------------------- allocations ------------------

class AllocRecord:
    """One storage that an op returned inside a tracer: where and when it came from."""

    # set for every record (__init__)
    seq: int                 # this process's sequence number (monotonic)
    time_ns: int             # perf_counter_ns at allocation
    op: str                  # aten overload that returned it, e.g. "aten.addmm.default"
    module: str | None       # module path ("" = the model itself); None = outside the model
    phase: str               # forward / backward / optimizer / other
    device: str              # "cpu", "cuda:0"
    ptr: int                 # storage data_ptr
    nbytes: int              # storage nbytes (nominal)
    dtype: str               # of the op output that made the storage
    shape: tuple
    # set when known (class defaults otherwise)
    _block = None            # accounting.Block: read at allocation for amem, else on first use
    stack = None             # ["file:line in func", ...] innermost last, when stacks are recorded
    grad_node = None         # in backward: the node whose backward ran the op ("AddmmBackward0")
    grad_node_module = None  # ... and the module that made that node in forward
    source = None            # copies (_to_copy, clone): (key, dtype, model-state entry, is the input)
    autocast = False         # autocast was on in the enclosing module when the op ran
    recompute = False        # ran in backward inside a module forward: a checkpoint recomputation
    in_graph = False         # the output got a grad_fn: part of the autograd graph
    freed_seq = None         # when the storage died (None while alive)
    freed_ns = None
    saved_by = ()            # SlotRecords that saved (a view of) it; a list once there is one
    roles = frozenset()      # {"parameter", "gradient", "optimizer_state", "input"} learned later; a set once set

    def __init__(self, op, module, phase, device, ptr, nbytes, dtype, shape):
        self.seq, self.time_ns = next_seq(), now_ns()
        self.op, self.module, self.phase = op, module, phase
        self.device, self.ptr, self.nbytes, self.dtype, self.shape = device, ptr, nbytes, dtype, shape

    @property
    def key(self):
        return (self.device, self.ptr)

    @property
    def alive(self) -> bool:
        return self.freed_seq is None

    @property
    def block(self):
        """The allocator's block (a rounding is a pure function of the size: made on demand)."""
        if self._block is None:
            from .accounting import block_of

            self._block = block_of(self.ptr, self.nbytes, self.device)
        return self._block

    def add_role(self, role: str) -> None:
        self.roles = self.roles | {role}

    def add_saver(self, slot) -> None:
        if not self.saved_by:
            self.saved_by = []
        self.saved_by.append(slot)


# ---------------------------------------------------------------- the autograd graph -----------

class NodeRecord:
    """One autograd node made inside a tracer, with the tensors it saved for backward."""

    __slots__ = ("seq", "name", "module", "step", "slots", "found", "detail")

    def __init__(self, seq, name, module, step, found):
        self.seq = seq          # the node's autograd sequence number (creation order)
        self.name = name        # "AddmmBackward0"
        self.module = module    # module path whose forward made it (None: outside the model)
        self.step = step        # index of the forward/backward step it belongs to
        self.slots = []         # SlotRecords
        self.found = found      # "op output" (its module is exact) or "graph walk" (reached from a later node)
        self.detail = None      # why a slot could not be read, if one could not


class SlotRecord:
    """One saved tensor: who saved it (node.slot, or a holder outside the graph), what it is, what
    it costs. Facts are taken when it is saved; sentences and sizes are made when a report asks."""

    # set for every record (__init__)
    module: str | None       # module path when it was saved
    step: int                # step index when it was saved
    holder: str | None       # who keeps it when no node does: "checkpoint" (its inputs), or None
    captured_seq: int
    # set when known (class defaults otherwise)
    node = None              # NodeRecord, once a node names it
    slot = None              # slot name ("mat1", "saved_tensors[1]")
    state = "unreadable"     # "held", "released" (backward freed it), "other_hooks" (checkpoint,
                             #   offloading), "unknown_hooks", "unreadable"
    detail = None            # why, for the states other than held and released
    key = None               # (device, storage data_ptr); None for 0-byte storages
    device = None
    nbytes = 0               # storage nbytes (nominal)
    dtype = None             # torch.dtype
    shape = None             # torch.Size of the saved view
    alloc = None             # the AllocRecord of its storage (None if made before the tracer)
    block = None             # for a storage made before the tracer under amem: its block, read at once
    state_of = None          # ("parameter" | "buffer", name) when it is model state
    is_input = False         # its storage is the model's input
    released_seq = None
    released_ns = None
    what = ""                # for slots that were not read: why

    def __init__(self, module, step, holder):
        self.module, self.step, self.holder, self.captured_seq = module, step, holder, next_seq()

    @property
    def label(self) -> str:
        if self.node is not None:
            return f"{self.node.name}.{self.slot}"
        return "checkpoint.input" if self.holder == "checkpoint" else "(node not seen)"

    @property
    def owner_module(self):
        """The module charged for it: its node's module, else the module it was saved in."""
        return self.node.module if self.node is not None else self.module
