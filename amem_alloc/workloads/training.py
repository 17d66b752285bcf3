"""The allocation pattern of a GPT-style decoder's training steps, without running a model.

Each step draws a sequence length at random (seeded), allocates the activations a transformer
block keeps for backward (the attention scores grow with the square of the sequence length),
frees them in reverse during backward while gradients appear, and updates parameters with Adam
states that live for the whole run. Varying shapes are what make caching allocators fragment.
Events are ("alloc", id, bytes, stream) and ("free", id, 0, stream).
"""
from __future__ import annotations

import random
from typing import Iterator

Event = tuple[str, int, int, int]


class _Ids:
    def __init__(self) -> None:
        self.next = 0

    def new(self) -> int:
        self.next += 1
        return self.next


def _layer_activation_sizes(batch: int, seq: int, width: int, heads: int, elem: int) -> list[int]:
    tokens = batch * seq
    return [
        tokens * width * elem,            # layer-norm output saved for the qkv projection
        3 * tokens * width * elem,        # q, k, v
        batch * heads * seq * seq * elem,  # attention probabilities
        tokens * width * elem,            # attention output
        tokens * width * elem,            # residual
        4 * tokens * width * elem,        # MLP up-projection
        4 * tokens * width * elem,        # activation (GELU) output
    ]


def training_events(
    steps: int = 20,
    layers: int = 12,
    width: int = 768,
    heads: int = 12,
    batch: int = 8,
    max_seq: int = 1024,
    seed: int = 0,
    elem: int = 2,
) -> Iterator[Event]:
    rng = random.Random(seed)
    ids = _Ids()
    param_sizes = [4 * width * width * 4, 12 * width * width // 4 * 4] * layers  # fp32 weights
    params = [ids.new() for _ in param_sizes]
    for pid, size in zip(params, param_sizes):
        yield ("alloc", pid, size, 0)
    optimizer_state: list[int] = []
    for _ in range(steps):
        seq = rng.randrange(max_seq // 8, max_seq + 1)
        saved: list[tuple[int, int]] = []
        for _layer in range(layers):
            for size in _layer_activation_sizes(batch, seq, width, heads, elem):
                tid = ids.new()
                saved.append((tid, size))
                yield ("alloc", tid, size, 0)
            tmp = ids.new()  # a temporary (e.g. a dropout mask) that dies at once
            yield ("alloc", tmp, batch * seq * width, 0)
            yield ("free", tmp, 0, 0)
        grads = []
        for tid, size in reversed(saved):  # backward frees activations in reverse
            g = ids.new()
            yield ("alloc", g, size, 0)     # gradient w.r.t. the activation
            yield ("free", tid, 0, 0)
            yield ("free", g, 0, 0)
        for size in param_sizes:
            g = ids.new()
            grads.append(g)
            yield ("alloc", g, size, 0)
        if not optimizer_state:  # Adam's exp_avg and exp_avg_sq, allocated on the first step
            for size in param_sizes:
                for _ in range(2):
                    s = ids.new()
                    optimizer_state.append(s)
                    yield ("alloc", s, size, 0)
        for g in grads:  # zero_grad(set_to_none=True)
            yield ("free", g, 0, 0)
