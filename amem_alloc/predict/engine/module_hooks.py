"""A compiled module's own hooks: which it has, which dynamo never traces, and its call with its
forward compiled and its hooks run eager around it.

Design note
-----------
torch compiles a module's call (`torch.compile(module)`, `module.compile()`) with the hooks put on
the module itself; dynamo traces a hook into the region unless the hook is dynamo-disabled.
FSDP2's hooks are (torch.distributed.fsdp wraps each in `torch._dynamo.disable`): on the GPU its
all-gather and reshard run eager, between the graphs of the module's forward. So is the
prediction's: while a compiled module has hooks of its own, its call runs as eager with
`forward` swapped, for that call, for the compiled forward. Hooks of any other kind run eager
there too (the caller notes it: torch would have traced them into the region).

The regions run on torch's fakes before they run on the session's tensors (compiled.py); FSDP2's
hooks must not run there (they would gather into, and free, FSDP's own state with fake tensors),
so a region with FSDP2 modules inside it is run by dynamo directly (`fsdp_inside`). A module
whose forward dynamo skips as a frame of its own (torch's own modules) is not compiled at all once
its hooks break the graph (`dynamo_skips_forward`): it runs as eager, as torch runs it.
"""
from __future__ import annotations

import contextlib
import inspect

import torch

KINDS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")


def own(module: torch.nn.Module) -> list[str]:
    """The kinds of hooks on the module itself ("forward pre hooks", ...)."""
    return [k.strip("_").replace("_", " ") for k in KINDS if getattr(module, k, None)]


def dynamo_skips(module: torch.nn.Module, kind: str) -> bool:
    """Whether every hook of this kind on the module is one dynamo does not trace (FSDP2's)."""
    table = getattr(module, "_" + kind.replace(" ", "_"), {}) or {}
    return all(fsdp_hook(h) for h in table.values())


def torch_compiles_nothing(module: torch.nn.Module) -> bool:
    """Whether torch compiles nothing of the module's call: a hook of its own breaks the graph
    before its forward (FSDP2's, dynamo-disabled) and dynamo skips that forward as a frame of its
    own (`dynamo_skips_forward`)."""
    hooks = [h for kind in KINDS for h in (getattr(module, kind, None) or {}).values()]
    return any(fsdp_hook(h) for h in hooks) and dynamo_skips_forward(module)


def fsdp_hook(hook) -> bool:
    """Whether the hook is FSDP's (a bound method of its state, under its dynamo-disabling wrapper)."""
    fn = getattr(hook, "func", hook)   # (functools.partial)
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    return "torch/distributed/fsdp/" in getattr(getattr(fn, "__code__", None), "co_filename", "").replace("\\", "/")


@contextlib.contextmanager
def forward_as(module: torch.nn.Module, forward):
    """The module's `forward`, for one call, is `forward` (its compiled form)."""
    had, before = "forward" in module.__dict__, module.__dict__.get("forward")
    module.forward = forward
    try:
        yield
    finally:
        if had:
            module.forward = before
        else:
            del module.forward


def fsdp_inside(module: torch.nn.Module | None, fn) -> bool:
    """Whether running `fn` (the region's code: the module's call, or its bare `forward`) runs
    FSDP2's hooks: a module under it is FSDP2's, or the module itself is and its call is run."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:   # (a torch without torch.distributed)
        return False
    if module is None:
        return False
    if any(isinstance(m, FSDPModule) for m in module.modules() if m is not module):
        return True
    bare_forward = getattr(fn, "__self__", None) is module and getattr(fn, "__name__", "") == "forward"
    return isinstance(module, FSDPModule) and not bare_forward


def fsdp1_inside(module: torch.nn.Module | None) -> bool:
    """Whether the region holds a module of FSDP1 (FullyShardedDataParallel), whose lazy
    initialisation and hooks change its own state as they run: they must not run on torch's fakes."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:   # (a torch without torch.distributed)
        return False
    return module is not None and any(isinstance(m, FullyShardedDataParallel) for m in module.modules())


def dynamo_skips_forward(module: torch.nn.Module) -> bool:
    """Whether dynamo skips the module's `forward` as a frame of its own, as it does torch's own
    modules' (torch.nn's Sequential, Linear): after the hooks break the graph torch then compiles
    nothing of the module (checked on the CPU: fully_shard on a Sequential, compiled, gives dynamo's
    backend no graph; on a module class of the program's, one graph of its forward)."""
    import torch._dynamo.trace_rules as trace_rules

    forward = getattr(type(module), "forward", None)
    return forward is not None and bool(trace_rules.check(forward))
