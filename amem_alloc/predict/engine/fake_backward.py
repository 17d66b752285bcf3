"""torch.autograd.grad for tracing on torch's fake CUDA tensors without a GPU.

AOTAutograd traces the joint forward-backward graph by calling `torch.autograd.grad` on fake
tensors. torch's C++ engine, seeing nodes on a CUDA device, stashes every CUDA device's current
stream (`GraphTask::stash_current_streams`, torch/csrc/autograd/engine.cpp): with no GPU the fake
device guard claims 8 devices while `hasPrimaryContext` finds none, and it throws. This is the
engine's walk done in Python for that trace only: the same nodes called in the same order (ready
nodes by sequence number, highest first, as the engine's CPU queue runs them), gradients summed
per input slot and checked against each node's input metadata as `validate_outputs` does (summed
to the input's shape, cast to its dtype). A Python autograd.Function's node (a HOP's autograd op,
FlexAttention's) runs through its `apply`, the gradients it got none of as zeros, as the engine's
PyNode does. Hooks on tensors and nodes are not run (a compiled region that registers them is
traced as eager instead).
"""
from __future__ import annotations

import heapq

import torch
from torch.autograd.graph import get_gradient_edge


def _validate(grad, meta):
    """engine.cpp validate_outputs: a gradient summed to its input's shape, cast to its dtype."""
    shape = tuple(meta.shape)
    if tuple(grad.shape) != shape:
        grad = grad.sum_to_size(shape) if shape else grad.sum()
    if grad.dtype != meta.dtype:
        grad = grad.to(meta.dtype)
    return grad


def _as_list(x) -> list:
    return [x] if isinstance(x, torch.Tensor) else list(x)


def _needed(roots, targets) -> dict:
    """Node -> whether a gradient asked for is reached from it (only those nodes run)."""
    needed: dict = {}
    stack = [(n, False) for n in roots]
    while stack:
        node, done = stack.pop()
        if done:
            needed[node] = any(k[0] is node for k in targets) or any(
                needed.get(n, False) for n, _ in node.next_functions if n is not None)
            continue
        if node in needed:
            continue
        needed[node] = False
        stack.append((node, True))
        stack.extend((n, False) for n, _ in node.next_functions if n is not None and n not in needed)
    return needed


class _Walk:
    def __init__(self, outputs, grad_outputs, inputs):
        self.targets: dict = {}
        for i, t in enumerate(inputs):
            e = get_gradient_edge(t)
            self.targets.setdefault((e.node, e.output_nr), []).append(i)
        self.roots = [(get_gradient_edge(o), g) for o, g in zip(outputs, grad_outputs)]
        self.needed = _needed([e.node for e, _ in self.roots], self.targets)
        self.deps: dict = {}
        for node, ok in self.needed.items():
            for n, _ in node.next_functions if ok else ():
                if n is not None and self.needed.get(n):
                    self.deps[n] = self.deps.get(n, 0) + 1
        self.buffers: dict = {}
        self.result = [None] * len(inputs)

    def add(self, node, nr: int, grad) -> None:
        buf = self.buffers.setdefault(node, {})
        buf[nr] = grad if nr not in buf else buf[nr] + grad

    def run(self) -> tuple:
        for e, g in self.roots:
            if g is not None:
                self.add(e.node, e.output_nr, g)
        ready = [(-n._sequence_nr(), id(n), n) for n in {e.node for e, _ in self.roots}
                 if self.needed.get(n) and not self.deps.get(n)]
        heapq.heapify(ready)
        while ready:
            self.step(heapq.heappop(ready)[2], ready)
        return tuple(self.result)

    def step(self, node, ready) -> None:
        buf = self.buffers.pop(node, {})
        for nr, g in buf.items():
            for i in self.targets.get((node, nr), ()):
                self.result[i] = g
        if isinstance(node, torch._C._functions.AccumulateGrad) or not node.next_functions:
            return
        metas = node._input_metadata
        count = max(len(metas), max(buf, default=-1) + 1)
        grads = [buf.get(k) for k in range(count)]
        grads = [_validate(g, metas[k]) if g is not None and k < len(metas) else g for k, g in enumerate(grads)]
        outs = node(*grads) if callable(node) else _python_function(node, grads, metas)
        for (nxt, nr), g in zip(node.next_functions, outs if isinstance(outs, tuple) else (outs,)):
            if nxt is None or not self.needed.get(nxt):
                continue
            if g is not None:
                self.add(nxt, nr, _validate(g, nxt._input_metadata[nr]) if nxt._input_metadata else g)
            self.deps[nxt] -= 1
            if self.deps[nxt] == 0:
                heapq.heappush(ready, (-nxt._sequence_nr(), id(nxt), nxt))


def _zeros(meta) -> torch.Tensor:
    return torch.zeros(tuple(meta.shape), dtype=meta.dtype, device=meta.device)


def _python_function(node, grads: list, metas) -> tuple:
    """The backward of a Python autograd.Function (a HOP's autograd op, say FlexAttention's):
    `node.apply`, with the gradients it was given none of as zeros, as the engine's PyNode
    materializes them (ctx.set_materialize_grads, True by default)."""
    if getattr(node, "materialize_grads", True):
        grads = [_zeros(metas[k]) if g is None and k < len(metas) else g
                 for k, g in enumerate(grads)]
    return node.apply(*grads)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, only_inputs=True,
         allow_unused=None, is_grads_batched=False, materialize_grads=False):
    """torch.autograd.grad's answer, walked in Python (see the module's note)."""
    outputs, inputs = _as_list(outputs), _as_list(inputs)
    grad_outputs = [torch.ones_like(o) for o in outputs] if grad_outputs is None else _as_list(grad_outputs)
    out = _Walk(outputs, grad_outputs, inputs).run()
    if materialize_grads:
        out = tuple(torch.zeros_like(t) if g is None else g for g, t in zip(out, inputs))
    return out
