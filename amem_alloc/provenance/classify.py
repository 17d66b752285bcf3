"""What a storage is: its category (the profiler's), and for a saved tensor, a sentence.

Both read a Knowledge: the storage keys of the model's parameters and buffers, of the model's
inputs, of gradients and of optimizer state, as the tracer knows them when asked.

Category rules, first match wins (the profiler's categories, decided from what we saw):
    parameter        a parameter or buffer of the traced model
    gradient         the .grad of a parameter (now, or when it was accumulated)
    optimizer_state  a tensor in an optimizer's state
    input            a tensor passed to the model
    activation       saved for backward by an autograd node; or made in forward and still alive
                     when backward began (a forward output, e.g. the logits)
    temporary        made in forward and freed before backward began; made by the optimizer and
                     not kept as state; or freed, with no other category
    autograd_detail  made in backward and not a gradient (gradients of activations, recomputation)
    None             alive, made outside forward/backward/step, and none of the above
"""
from __future__ import annotations

import bisect

from ..provenance_format import module_label


class Knowledge:
    """Storage keys the tracer has learned, and the starts of each backward (as sequence numbers)."""

    def __init__(self):
        self.model_state: dict = {}   # key -> ("parameter" | "buffer", name)
        self.inputs: set = set()
        self.grads: dict = {}             # key -> "parameter fc1.weight" (whose .grad it is)
        self.optimizer_state: dict = {}   # key -> "exp_avg of parameter fc1.weight"
        self.backward_starts: list[int] = []  # sorted sequence numbers


def _freed_before_backward(rec, know: Knowledge) -> bool:
    if rec.freed_seq is None:
        return False
    i = bisect.bisect_right(know.backward_starts, rec.seq)
    return i == len(know.backward_starts) or rec.freed_seq < know.backward_starts[i]


def _category_by_role(key, rec, know: Knowledge):
    """What the storage is known to be now (live storages only: a dead one's address may be reused)
    or was seen to become (rec.roles)."""
    live = rec is None or rec.alive
    roles = rec.roles if rec is not None else ()
    if "parameter" in roles or (live and key in know.model_state):
        return "parameter"
    for role, keys in (("gradient", know.grads), ("optimizer_state", know.optimizer_state), ("input", know.inputs)):
        if role in roles or (live and key in keys):
            return role
    return None


def category(key, rec, know: Knowledge):
    """The profiler's category for a storage (rec: its AllocRecord, or None if made elsewhere)."""
    by_role = _category_by_role(key, rec, know)
    if by_role is not None or rec is None:
        return by_role
    if any(s.state != "other_hooks" for s in rec.saved_by):
        return "activation"
    if rec.phase == "forward":
        return "temporary" if _freed_before_backward(rec, know) else "activation"
    if rec.phase == "backward":
        return "autograd_detail"
    return "temporary" if rec.phase == "optimizer" or not rec.alive else None


# ---------------------------------------------------------------- saved tensors ----------------

def _copy_of(rec, dtype: str):
    """(kind, sentence) when rec is a copy of a parameter or of the model input, else None."""
    if rec is None or rec.source is None:
        return None
    _, src_dtype, src_state, src_is_input = rec.source
    how = "autocast copy" if rec.autocast and src_dtype != dtype else "copy"
    if src_state is not None:
        return f"{src_state[0]}_copy", f"{how} of {src_state[0]} {src_state[1]} ({src_dtype} -> {dtype})"
    if src_is_input:
        return "input_copy", f"{how} of the model input ({src_dtype} -> {dtype})"
    return None


def describe_saved(state, is_input: bool, rec, dtype: str):
    """(kind, sentence) for a saved tensor, from what was known when it was saved: its model-state
    entry (state), whether it is the model input, its AllocRecord. kind is one of parameter,
    buffer, parameter_copy, buffer_copy, input, input_copy, output, external."""
    if state is not None:
        return state[0], f"{state[0]} {state[1]}"
    if is_input:
        return "input", "the model input"
    copy = _copy_of(rec, dtype)
    if copy is not None:
        return copy
    if rec is None:
        return "external", "a tensor allocated before the tracer started"
    return "output", f"output of {rec.op} in {module_label(rec.module)}{_copy_note(rec, dtype)}"


def _copy_note(rec, dtype: str) -> str:
    """What kind of copy an op's output is: autocast's only when it changed the dtype; a clone with
    the same dtype (matmul's reshape of a non-contiguous input, .contiguous()) is a layout copy."""
    if rec.source is None:
        return ""
    if rec.autocast and rec.source[1] != dtype:
        return f" (autocast copy, {rec.source[1]} -> {dtype})"
    if rec.source[1] != dtype:
        return f" (copy, {rec.source[1]} -> {dtype})"
    return " (a layout copy: reshape or .contiguous())" if "clone" in str(rec.op) else ""


def describe(key, rec, know: Knowledge, dtype: str) -> str:
    """A sentence for any storage: whose gradient or optimizer state it is, else describe_saved."""
    if key in know.grads:
        return f"the .grad of {know.grads[key]}"
    if key in know.optimizer_state:
        return f"optimizer state: {know.optimizer_state[key]}"
    return describe_saved(know.model_state.get(key), key in know.inputs, rec, dtype)[1]
