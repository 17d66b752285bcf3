"""Who asked for a block: the first frame of its stack that is the user's, not the allocator's.

Design note
-----------
torch's stacks start inside the allocator (DeviceCachingAllocator::malloc, empty_cuda, the
dispatcher, ...) and end in the interpreter; amem's hold Python frames only. A reader wants
the frame that explains the memory, so `call_site(frames)` picks, innermost first:

1. an autograd node (`BmmBackward0::apply`, `AccumulateGrad::apply`): the backward pass runs on
   the engine's threads, whose stacks have no Python frame of the user's at all;
2. the first Python frame outside torch, the interpreter's standard library and tensor
   plumbing libraries (einops): the user's model or script;
3. the aten operator (`at::_ops::div_Tensor::call` -> `aten::div.Tensor`): C++-only stacks;
4. the first frame that is not allocator or dispatcher machinery.

Traces written with file names cut to their last component (`module.py`) cannot tell torch's
files from the user's by path, so torch's well-known plumbing functions are also matched by
(file name, function name).
"""
from __future__ import annotations

import re
from typing import Any

from .frames import frame_fields

NO_STACK = "(no stack recorded)"

# Python files that are never the user's: torch itself, the standard library, and libraries that
# only forward to torch operators.
_LIBRARY_DIRS = ("torch/", "torch_geometric/utils/", "einops/", "functorch/", "triton/", "python3.", "/lib/python",
                 "site-packages/torch", "transformers/utils/", "accelerate/hooks.py")
# (file name, function) of torch plumbing, for traces whose file names lost their directory.
_PLUMBING = {("module.py", "_call_impl"), ("module.py", "_wrapped_call_impl"), ("optimizer.py", "wrapper"),
             ("optimizer.py", "_use_grad"), ("_tensor.py", "backward"), ("__init__.py", "backward"),
             ("__init__.py", "_make_grads"), ("graph.py", "_engine_run_backward"), ("functional.py", "einsum"),
             ("_contextlib.py", "decorate_context"), ("threading.py", "run"), ("threading.py", "_bootstrap"),
             ("threading.py", "_bootstrap_inner"), ("runpy.py", "_run_code"), ("runpy.py", "_run_module_as_main")}
_PLUMBING_FILES = ("einops.py", "_backends.py")

_NODE = re.compile(r"(?:^|::)(\w*Backward\w*|AccumulateGrad)::apply\(")
_MACHINERY = ("CUDACachingAllocator", "unwind::", "CapturedTraceback", "gather_with_cpp", "at::detail::empty",
              "at::native::empty", "TensorIterator", "c10::impl::", "at::_ops::", "at::(anonymous namespace)::",
              "wrapper_CUDA", "create_out", "set_output", "VariableType", "torch::autograd::", "ADInplaceOrView",
              "c10::Dispatcher", "Py", "_PyEval", "pthread", "clone", "start_thread", "libc", "execute_native")


def _is_library(filename: str, name: str) -> bool:
    if any(d in filename for d in _LIBRARY_DIRS):
        return True
    base = filename.rsplit("/", 1)[-1]
    return (base, name) in _PLUMBING or ("/" not in filename and base in _PLUMBING_FILES)


def _op_name(fn: str) -> str | None:
    match = re.search(r"at::_ops::(\w+)::call\(", fn)
    if not match:
        return None
    op = match.group(1)
    # aten's C++ names join the overload with an underscore (div_Tensor): show it as aten::div.Tensor
    head, sep, overload = op.rpartition("_")
    return f"aten::{head}.{overload}" if sep and overload[:1].isupper() else f"aten::{op}"


# what one frame is, for call_site: (kind, label)
_USER, _LIBRARY, _NODE_FRAME, _OP_FRAME, _OTHER, _MACHINE = range(6)


def _classify(frame: Any) -> tuple[int, str] | None:
    fields = frame_fields(frame)
    if fields is None:
        return None
    filename, line, name = fields
    if filename.endswith(".py"):
        return (_LIBRARY if _is_library(filename, name) else _USER), f"{filename}:{line} {name}"
    if "::apply(" in name:
        node = _NODE.search(name)
        if node:
            return _NODE_FRAME, f"{node.group(1)} (backward)"
    if "at::_ops::" in name:
        op = _op_name(name)
        if op:
            return _OP_FRAME, op
    if any(m in name for m in _MACHINERY):
        return _MACHINE, name[:200]
    return _OTHER, (f"{filename}:{name}" if filename not in ("", "??") else name)[:200]


_KIND_NAMES = {_USER: "python", _LIBRARY: "python", _NODE_FRAME: "autograd", _OP_FRAME: "op", _OTHER: "frame",
               _MACHINE: "frame"}


def _pick(kinds: list[tuple[int, str]]) -> tuple[str, str]:
    """One pass, innermost first: a node before any Python frame, else the first user frame, else
    the first aten operator, else torch's innermost Python frame, else the first plain frame."""
    if not kinds:
        return NO_STACK, "none"
    seen_python, first = False, {}
    for kind, label in kinds:
        if kind == _USER:
            return label, "python"
        if kind == _NODE_FRAME and not seen_python:
            return label, "autograd"
        seen_python = seen_python or kind == _LIBRARY
        first.setdefault(kind, label)
    for kind in (_OP_FRAME, _LIBRARY, _OTHER, _MACHINE):
        if kind in first:
            return first[kind], _KIND_NAMES[kind]
    return kinds[0][1], "frame"


def call_site(frames: Any) -> tuple[str, str]:
    """(label, kind) for a stack: kind is "autograd", "python", "op", "frame" or "none"."""
    kinds = [k for k in (_classify(f) for f in (frames if isinstance(frames, list) else [])) if k]
    return _pick(kinds)


class CallSites:
    """call_site()'s label, with each frame classified once: torch's files share their frame
    entries between events, so a trace of 19k events has about a thousand distinct frames."""

    def __init__(self) -> None:
        self._frames: dict[int, tuple[Any, tuple[int, str] | None]] = {}
        self._stacks: dict[int, tuple[Any, str]] = {}

    def _kind(self, frame: Any) -> tuple[int, str] | None:
        hit = self._frames.get(id(frame))
        if hit is None or hit[0] is not frame:
            hit = self._frames[id(frame)] = (frame, _classify(frame))
        return hit[1]

    def __call__(self, frames: Any) -> str:
        hit = self._stacks.get(id(frames))
        if hit is not None and hit[0] is frames:
            return hit[1]
        kinds = [k for k in map(self._kind, frames if isinstance(frames, list) else []) if k]
        label = _pick(kinds)[0]
        self._stacks[id(frames)] = (frames, label)
        return label
