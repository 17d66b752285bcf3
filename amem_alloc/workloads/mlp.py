"""The deep MLP of the activation-checkpointing literature: batch 64, width 1024, 16 layers.

Without checkpointing every layer's activations live until backward reaches it; with
checkpointing (torch.utils.checkpoint.checkpoint_sequential, 4 segments) only the segment
boundaries are kept and each segment's activations are recomputed during backward, so the peak
falls while the allocator sees many more short-lived blocks. `size` scales the batch (64*size),
which is what activations grow with (at batch 64 the weights, gradients and momentum, 192 MiB,
outweigh the activations, 8 MiB); SGD with momentum, a new random batch per step.
"""
from __future__ import annotations

from typing import Callable

DEFAULT_STEPS = 3
SEGMENTS = 4  # checkpoint_sequential's segments


def run(size: int = 1, steps: int | None = None, device: str = "cpu", seed: int = 0,
        on_step: Callable[[int], None] | None = None, checkpoint: bool = False) -> dict:
    """Trains for `steps` steps; calls on_step(i) after each. Returns what ran."""
    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint_sequential

    torch.manual_seed(seed)
    batch, width, layers = 64 * size, 1024, 16
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    steps = DEFAULT_STEPS if steps is None else steps
    for i in range(steps):
        x = torch.randn(batch, width, device=device, requires_grad=checkpoint)
        out = checkpoint_sequential(model, SEGMENTS, x, use_reentrant=False) if checkpoint else model(x)
        out.square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x, out
        if on_step:
            on_step(i)
    return {"steps": steps, "batch": batch, "width": width, "layers": layers, "checkpoint": checkpoint}


def run_checkpointed(size: int = 1, steps: int | None = None, device: str = "cpu", seed: int = 0,
                     on_step: Callable[[int], None] | None = None) -> dict:
    return run(size, steps, device, seed, on_step, checkpoint=True)
