"""FSDP-style training: each layer's parameters are all-gathered on a communication stream just
before use and freed right after, forward and backward.

Each rank of a fully sharded data-parallel job keeps 1/world of every layer's parameters (a flat
shard). Before a layer runs, its full parameters are all-gathered into a fresh flat buffer on a
separate communication stream; the compute stream waits for that stream (wait_stream), uses the
buffer and frees it (the buffer is marked as used there with record_stream, as FSDP does), so
the memory goes back to the communication stream's pool while the compute stream may still be
reading it. The next layer's gather is issued before the current layer computes (forward
prefetch), so two layers' full parameters are live at once. Backward gathers each layer again,
computes the full gradients, and reduce-scatters them on the communication stream into a
gradient shard; the full gradient buffer is freed after. One process plays one rank: the other
ranks' shards are stand-ins (the local shard copied into their slots), so the memory pattern of a
world-size job is reproduced without a process group.

`size` scales the width (768*size: 2.3 MB of gathered parameters per layer at size 1); 6 layers,
world 4, batch 64*size, SGD on the shards.
"""
from __future__ import annotations

from typing import Callable

from .streams import Stream

WORLD = 4
LAYERS = 6


class _Sharded:
    """One linear layer's weight and bias as a flat shard (1/WORLD of them, padded)."""

    def __init__(self, width: int, device) -> None:
        import torch

        self.width = width
        self.numel = width * width + width
        self.shard_numel = -(-self.numel // WORLD)
        self.shard = (torch.randn(self.shard_numel, device=device) / width ** 0.5).requires_grad_(False)
        self.grad = torch.zeros_like(self.shard)

    def all_gather(self, comm: Stream, compute: Stream):
        """The full flat parameters, gathered on `comm` after what `compute` has queued."""
        import torch

        comm.wait(compute)
        with comm.use():
            full = torch.empty(WORLD * self.shard_numel, device=self.shard.device)
            for rank in range(WORLD):  # all_gather_into_tensor: every rank's shard into its slot
                full[rank * self.shard_numel:(rank + 1) * self.shard_numel].copy_(self.shard)
        return full

    def views(self, full):
        w = full[: self.width * self.width].view(self.width, self.width)
        return w, full[self.width * self.width: self.numel]

    def reduce_scatter(self, full_grad, comm: Stream, compute: Stream) -> None:
        """Sums the full gradient over the (stand-in) ranks into this rank's gradient shard, on `comm`."""
        import torch

        comm.wait(compute)
        comm.keep(full_grad)
        with comm.use():
            padded = torch.zeros(WORLD * self.shard_numel, device=full_grad.device)
            padded[: self.numel].copy_(full_grad)
            self.grad.add_(padded.view(WORLD, self.shard_numel).sum(0))
            del padded
        compute.wait(comm)


def _step(layers: list[_Sharded], x, comm: Stream, compute: Stream) -> None:
    """One forward and backward pass, layer by layer, with gathered parameters."""
    import torch
    from torch.nn import functional as F

    saved = []  # each layer's input, kept for backward
    full = layers[0].all_gather(comm, compute)
    for i, layer in enumerate(layers):
        nxt = layers[i + 1].all_gather(comm, compute) if i + 1 < len(layers) else None  # prefetch
        compute.wait(comm)
        compute.keep(full)
        w, b = layer.views(full)
        saved.append(x)
        x = torch.relu(F.linear(x, w, b))
        del w, b, full  # reshard after forward: the gathered buffer is freed on the compute stream
        full = nxt
    grad = 2 * x / x.numel()  # d/dx of the loss x.square().mean()
    del x
    for i in reversed(range(len(layers))):
        layer = layers[i]
        full = layer.all_gather(comm, compute)
        compute.wait(comm)
        compute.keep(full)
        w, b = layer.views(full)
        inp = saved.pop()
        out = torch.relu(F.linear(inp, w, b))  # recompute the activation mask (no autograd graph kept)
        grad = grad * (out > 0)
        del out
        full_grad = torch.cat([(grad.T @ inp).reshape(-1), grad.sum(0)])
        grad = grad @ w
        del w, b, full, inp
        layer.reduce_scatter(full_grad, comm, compute)
        del full_grad


def run(size: int = 1, steps: int | None = None, device: str = "cpu", seed: int = 0,
        on_step: Callable[[int], None] | None = None) -> dict:
    """Trains for `steps` steps (default 3); calls on_step(i) after each."""
    import torch

    torch.manual_seed(seed)
    width, batch = 768 * size, 64 * size
    compute, comm = Stream(device, 0), Stream(device, 1)
    layers = [_Sharded(width, device) for _ in range(LAYERS)]
    steps = 3 if steps is None else steps
    for i in range(steps):
        x = torch.randn(batch, width, device=device)
        _step(layers, x, comm, compute)
        del x
        for layer in layers:  # SGD on the shards
            layer.shard.add_(layer.grad, alpha=-1e-2)
            layer.grad.zero_()
        if on_step:
            on_step(i)
    return {"steps": steps, "width": width, "layers": LAYERS, "world": WORLD, "batch": batch,
            "gathered_bytes": WORLD * layers[0].shard_numel * 4}
