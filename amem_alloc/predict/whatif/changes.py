"""The changes a what-if applies to a run, without an edit of the user's code: activation
checkpointing, the optimizer's implementation, how gradients are zeroed.

Design note
-----------
Each change is a context manager entered inside an active `predicting` block, around the user's
code, and left before the prediction is analysed; everything it patches is restored on exit. What
it changes is what the user would have changed by hand, so the re-prediction records what torch
would then allocate (never a formula on the unchanged figures):

* `checkpoint=blocks` / `checkpoint=sqrt`: on the first forward of a root module (a global forward
  pre-hook), the repeated block stacks are found (`find_blocks`: each ModuleList or Sequential of
  same-class blocks built of layers, not inside another, or `blocks=PATH`) and each block's `forward`
  is replaced on the instance, as transformers' GradientCheckpointingLayer does, by one running
  it under non-reentrant `torch.utils.checkpoint` (while grad is enabled). A checkpointed block
  writes no KV cache (`_no_cache`: `use_cache` False, its cache arguments None), as
  GradientCheckpointingLayer and transformers' models do when they checkpoint and as a hand-written
  `checkpoint(block, hidden)` does: a recompute would write the cache again, and checkpoint keeps
  its non-tensor inputs, the cache with every layer's keys and values, until backward reaches the
  block (GPT-2 small, batch 16, seq 1024: 48 MiB a block, +5% of the peak). `sqrt` groups the L
  blocks in segments of round(√L): the first block of a segment runs the whole segment under one
  checkpoint, the segment's other blocks pass its output on. What backward recomputes is the
  checkpointed segments' forward: their FLOPs are counted in forward with torch's FLOP formulas
  (an upper bound: checkpoint's early stop skips a segment's last ops when backward does not need
  them; counting in backward instead kept a recomputed tensor alive and changed the figures), and
  so are the roots' grad-enabled forwards, for the share of the step.
* `optimizer=for-loop` / `optimizer=fused`: torch.optim's optimizers are constructed with
  `foreach=False, fused=False` / `fused=True, foreach=False` (classes without a fused version are
  left as they are, and the change says so).
* `grads=set-to-none`: `zero_grad(set_to_none=False)` (Optimizer's and Module's) frees instead.

`applied` counts what the change did; a change that did nothing says why in `notes`.
"""
from __future__ import annotations

import functools
import inspect
import math
import weakref
from typing import Any

import torch

from ...patching import PatchSet, declare

ZERO_GRAD = declare("torch.optim.Optimizer, torch.nn.Module", "zero_grad",
                    "what-if grads=set-to-none: every zero_grad sets gradients to None")
OPTIMIZER_INIT = declare("every torch.optim optimizer class", "__init__",
                         "what-if optimizer=fused|foreach|for-loop: built with that implementation")
BLOCK_FORWARD = declare("each block of the model's repeated stack (the instance)", "forward",
                        "what-if checkpoint=blocks|sqrt: the blocks run under non-reentrant checkpointing")


class Change:
    """A patch of torch or the user's model, active between __enter__ and __exit__ (its PatchSet:
    every change declared above, undone on exit)."""

    name = ""
    costs_compute = False

    def __init__(self) -> None:
        self.applied = 0
        self.notes: list[str] = []
        self.patches = PatchSet()

    def __enter__(self) -> "Change":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.patches.close()
        self.patches = PatchSet()

    def finish(self) -> None:
        """Called after the run: notes for a change that did nothing."""


# ============================================================================ gradients
class GradsToNone(Change):
    name = "grads=set-to-none"

    def __enter__(self) -> "GradsToNone":
        for owner in (torch.optim.Optimizer, torch.nn.Module):
            self.patches.apply(ZERO_GRAD, owner, "zero_grad", self._wrap(owner.zero_grad))
        return self

    def _wrap(self, zero_grad):
        change = self

        @functools.wraps(zero_grad)
        def to_none(obj, set_to_none: bool = True):
            if not set_to_none:
                change.applied += 1
            return zero_grad(obj, set_to_none=True)
        return to_none

    def finish(self) -> None:
        if not self.applied:
            self.notes.append("no zero_grad(set_to_none=False) was called: the script already frees its gradients "
                              "(torch's default), so nothing changed")


# ============================================================================ the optimizer
def _optimizer_classes() -> list[type]:
    out = []
    for name in dir(torch.optim):
        cls = getattr(torch.optim, name)
        if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer) and cls is not torch.optim.Optimizer:
            if "__init__" in vars(cls):
                out.append(cls)
    return out


class OptimizerImpl(Change):
    """Every torch.optim optimizer built with the given implementation keywords."""

    def __init__(self, impl: str) -> None:
        super().__init__()
        self.impl = impl
        self.name = f"optimizer={impl}"
        self.untouched: set[str] = set()
        self.already: set[str] = set()          # built with these keywords by the script itself

    def _forced(self, cls: type) -> dict | None:
        params = inspect.signature(vars(cls)["__init__"]).parameters
        if self.impl == "fused":
            return {"fused": True, "foreach": False} if "fused" in params else None
        return {k: False for k in ("foreach", "fused") if k in params} or None

    def _already(self, kwargs: dict) -> bool:
        if self.impl == "fused":
            return kwargs.get("fused") is True
        return kwargs.get("foreach") is False and not kwargs.get("fused")

    def __enter__(self) -> "OptimizerImpl":
        for cls in _optimizer_classes():
            self.patches.apply(OPTIMIZER_INIT, cls, "__init__", self._wrap(cls, vars(cls)["__init__"], self._forced(cls)))
        return self

    def _wrap(self, cls: type, init, forced: dict | None):
        change = self

        @functools.wraps(init)
        def build(obj, *args, **kwargs):
            if type(obj) is cls or type(obj).__init__ is build:   # the outermost constructor decides
                if forced is None:
                    change.untouched.add(cls.__name__)
                elif change._already(kwargs):
                    change.already.add(cls.__name__)
                else:
                    kwargs.update(forced)
                    change.applied += 1
            return init(obj, *args, **kwargs)
        return build

    def finish(self) -> None:
        if self.untouched:
            self.notes.append(f"{', '.join(sorted(self.untouched))} has no {self.impl} implementation in torch: "
                              "left as it was")
        if self.already and not self.applied:
            self.notes.append(f"the script already builds {', '.join(sorted(self.already))} {self.impl}: "
                              "nothing changed")
        if not self.applied and not self.untouched and not self.already:
            self.notes.append("no torch.optim optimizer was built: nothing changed")


# ============================================================================ checkpointing
def _same_class_stack(module: torch.nn.Module) -> bool:
    children = list(module.children())
    return (isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)) and len(children) >= 2
            and len({type(c) for c in children}) == 1 and any(True for _ in children[0].parameters()))


def find_blocks(root: torch.nn.Module, path: str | None = None) -> list[tuple[str, list[torch.nn.Module]]]:
    """(qualified name, blocks) of each repeated block stack: `path` if given (none where it names
    no module with children), else every ModuleList/Sequential of >= 2 same-class blocks built of
    layers (a transformer's layers; each of a ResNet's four stages, the first holding the most
    activations) that is not inside another such stack (a MoE layer's experts); where no stack's
    blocks are built of layers, the stack with the most parameters (a list of Linear layers)."""
    if path is not None:
        try:
            stack = root.get_submodule(path)
        except AttributeError:
            return []
        children = list(stack.children())
        return [(path, children)] if children else []
    stacks = [(name, module) for name, module in root.named_modules() if _same_class_stack(module)]
    chosen: list[tuple[str, torch.nn.Module]] = []
    for name, module in stacks:   # named_modules: a stack before the stacks inside it
        inside = any(outer == "" or name.startswith(outer + ".") for outer, _ in chosen)
        if not inside and _built_of_layers(next(module.children())):
            chosen.append((name, module))
    if not chosen and stacks:
        chosen = [max(stacks, key=lambda s: sum(p.numel() for p in s[1].parameters()))]
    return [(name, list(module.children())) for name, module in chosen]


def _built_of_layers(block: torch.nn.Module) -> bool:
    """A block of two or more modules with parameters of their own (not a single Linear or Embedding)."""
    return sum(1 for m in block.modules() if next(m.parameters(recurse=False), None) is not None) >= 2


CACHE_ARGS = ("cache", "layer_past", "past_key_value", "past_key_values")   # transformers' names for a layer's KV cache


def _no_cache(block: torch.nn.Module, forward: Any):
    """A function of a block's call arguments: (args, kwargs, changed) with `use_cache` False and
    the cache arguments (CACHE_ARGS) None, positional or keyword, as transformers'
    GradientCheckpointingLayer sets them before it checkpoints a layer (cache arguments are kept for
    a layer that only reads its cache, `_can_checkpoint_with_cache`); `changed` says whether a
    cache was asked for."""
    try:
        params = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        params = {}
    position = {name: i for i, (name, p) in enumerate(params.items())
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)}
    off = {"use_cache": False}
    if not getattr(block, "_can_checkpoint_with_cache", False):
        off.update(dict.fromkeys(CACHE_ARGS))

    def strip(args: tuple, kwargs: dict) -> tuple[tuple, dict, bool]:
        args, kwargs, changed = list(args), dict(kwargs), False
        for name, value in off.items():
            i = position.get(name)
            if i is not None and i < len(args):
                changed |= _turn_off(args, i, value)
            elif name in kwargs:
                changed |= _turn_off(kwargs, name, value)
        return tuple(args), kwargs, changed
    return strip


def _turn_off(into: Any, where: Any, value: Any) -> bool:
    """into[where] = value where it asked for a cache (not None or False); whether it did."""
    if into[where] is None or into[where] is False:
        return False
    into[where] = value
    return True


def _first_tensor(out: Any) -> Any:
    return out[0] if isinstance(out, (tuple, list)) and out else out


def _flop_mode(into: dict, key: str):
    """A dispatch mode adding each op's FLOPs (torch's own formulas, torch.utils.flop_counter's
    registry) to into[key]. Not FlopCounterMode itself: its module tracker adds and removes global
    module hooks, which torch iterates while a forward fails."""
    from torch.utils.flop_counter import flop_registry
    from torch.utils._python_dispatch import TorchDispatchMode

    class FlopCount(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            formula = flop_registry.get(func._overloadpacket)
            if formula is not None:
                into[key] = into.get(key, 0) + formula(*args, **kwargs, out_val=out)
            return out
    return FlopCount()


class Checkpoint(Change):
    """Non-reentrant activation checkpointing around each block (`blocks`) or each segment of about
    √L blocks (`sqrt`) of the model's repeated stack."""

    costs_compute = True

    def __init__(self, scheme: str, blocks: str | None = None) -> None:
        super().__init__()
        self.scheme, self.path = scheme, blocks
        self.name = f"checkpoint={scheme}"
        self.stack: str | None = None            # the qualified names of the stacks found
        self.blocks = 0                          # blocks checkpointed: run with grad enabled, inside a segment
        self._checkpointed: set[int] = set()     # their ids
        self.already: list[str] = []             # stacks whose blocks the script checkpoints itself
        self.segment = 1
        self.flops = {"recompute": 0, "forward": 0}   # the recomputed ops' / the roots' grad-enabled forward FLOPs
        self._roots: list = []                   # weak references to the modules first seen running (a model
        # the program deletes is freed, as without the change)
        self._known: set[int] = set()            # ids of the roots' modules (alive while the run is)
        self._missing: list[str] = []
        self.caches_dropped = 0                  # checkpointed block calls that asked for a KV cache
        self.segment_calls = 0                   # calls of a segment's first block (the checkpoint's entry)

    # ---------------------------------------------------------------- finding the stack
    def __enter__(self) -> "Checkpoint":
        from torch.nn.modules import module as m

        self._hooks = [m.register_module_forward_pre_hook(self._on_forward),
                       m.register_module_forward_hook(self._after_forward, always_call=True)]
        self._counting: list = []                # (root, its FLOP-counting mode) of the roots' forwards being counted
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._hooks:
            h.remove()
        super().__exit__(*exc)

    def _on_forward(self, module: torch.nn.Module, args: Any) -> None:
        if id(module) not in self._known:
            self._roots.append(weakref.ref(module))
            self._known.update(id(m) for m in module.modules())
            self._wrap_stack(module)
        if any(module is r() for r in self._roots) and torch.is_grad_enabled() and not self._counting:
            counted = _flop_mode(self.flops, "forward")
            counted.__enter__()
            self._counting.append((module, counted))

    def _after_forward(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        if self._counting and self._counting[-1][0] is module:
            self._counting.pop()[1].__exit__(None, None, None)

    def _wrap_stack(self, root: torch.nn.Module) -> None:
        found = find_blocks(root, self.path)
        if not found:
            self._missing.append(type(root).__name__)
            return
        own = [name for name, blocks in found if all(getattr(b, "gradient_checkpointing", False) for b in blocks)]
        self.already += own   # (transformers' gradient_checkpointing_enable(): each layer checkpoints itself)
        found = [(name, blocks) for name, blocks in found if name not in own]
        if not found:
            return
        self.stack = ", ".join(name for name, _ in found)
        for _, blocks in found:
            segment = max(1, round(math.sqrt(len(blocks)))) if self.scheme == "sqrt" else 1
            self.segment = max(self.segment, segment)
            for start in range(0, len(blocks), segment):
                self._wrap_segment(blocks[start:start + segment])
        self.applied += 1

    # ---------------------------------------------------------------- running a segment
    def _wrap_segment(self, blocks: list[torch.nn.Module]) -> None:
        forwards = [b.forward for b in blocks]
        change, state, no_cache = self, {"out": None, "next": 1}, _no_cache(blocks[0], forwards[0])

        def run_segment(*args, **kwargs):
            out = forwards[0](*args, **kwargs)
            for fwd in forwards[1:]:
                try:
                    out = fwd(_first_tensor(out), *args[1:], **kwargs)
                except (RuntimeError, TypeError, ValueError, IndexError) as err:   # the model does more between
                    # its blocks (a UNet's skip concat); checkpoint's own control flow, _StopRecomputationError
                    # (an Exception), passes
                    from ..notes import NotModelledError
                    raise NotModelledError(f"what-if {change.name}: the blocks of {change.stack} are not a chain "
                                           f"(a block failed on the previous one's output: {type(err).__name__}); "
                                           "checkpoint=blocks checkpoints each block alone") from None
            return out

        def first(*args, **kwargs):
            change.segment_calls += 1
            if not torch.is_grad_enabled():
                out = run_segment(*args, **kwargs)
            else:
                from torch.utils.checkpoint import checkpoint
                change._checkpointed.update(id(b) for b in blocks)
                change.blocks = len(change._checkpointed)
                args, kwargs, dropped = no_cache(args, kwargs)
                change.caches_dropped += dropped
                with _flop_mode(change.flops, "recompute"):   # what backward will run again
                    out = checkpoint(run_segment, *args, use_reentrant=False, **kwargs)
            if len(blocks) > 1:                             # the segment's other blocks pass it on
                state["out"], state["next"] = out, 1
            return out

        def passed_on(index: int):
            def forward(*args, **kwargs):
                if state["out"] is None or state["next"] != index or args[:1] and args[0] is not _first_tensor(state["out"]):
                    from ..notes import NotModelledError
                    raise NotModelledError(f"what-if {change.name}: the blocks of {change.stack} are not called "
                                           "in order, each on the previous one's output (checkpoint=blocks works "
                                           "there)")
                state["next"] = index + 1
                out = state["out"]
                if index == len(blocks) - 1:
                    state["out"] = None
                return out
            return forward

        self.patches.apply(BLOCK_FORWARD, blocks[0], "forward", first)
        for i, block in enumerate(blocks[1:], 1):
            self.patches.apply(BLOCK_FORWARD, block, "forward", passed_on(i))

    def finish(self) -> None:
        if self.applied and self.segment_calls and not self.blocks:
            self.notes.append(f"the blocks of {self.stack} ran only without grad (they keep no activations): "
                              "nothing to checkpoint")
            self.applied = 0   # (a frozen reference model's layers)
        if self.already:
            self.notes.append(f"the script already checkpoints each block of {', '.join(self.already)} (transformers' "
                              "gradient_checkpointing_enable()): left as it is")
        if self.already and not self.applied:
            return
        if self.caches_dropped:
            self.notes.append(f"the blocks of {self.stack} were called with a KV cache (use_cache): checkpointed, "
                              "they write none, as transformers' gradient checkpointing does (a recompute would "
                              "write it again, and the checkpoint would keep it until backward)")
        if self.applied and not self.segment_calls:
            self.notes.append(f"the blocks of {self.stack} were never called (the model runs their children "
                              "itself, as `for attn, ff in self.layers:` does): nothing was checkpointed; name a "
                              "stack whose blocks are called with --blocks PATH")
            self.applied = 0   # wrapped, never run: no change, and no recompute to cost
        elif not self.applied:
            where = f"no module {self.path!r} with children" if self.path else "no repeated block stack (a " \
                "ModuleList or Sequential of same-class children)"
            roots = ", ".join(sorted(set(self._missing))) or "no module ran"
            self.notes.append(f"{where} in {roots}: nothing was checkpointed; name the stack with --blocks PATH")


def make(name: str, blocks: str | None = None) -> Change:
    """A fresh Change for one of whatif.NAMES (ValueError for another)."""
    if name == "grads=set-to-none":
        return GradsToNone()
    if name in ("optimizer=fused", "optimizer=for-loop"):
        return OptimizerImpl(name.split("=", 1)[1])
    if name in ("checkpoint=blocks", "checkpoint=sqrt"):
        return Checkpoint(name.split("=", 1)[1], blocks)
    raise ValueError(f"unknown what-if {name!r} (whatif.NAMES lists them)")
