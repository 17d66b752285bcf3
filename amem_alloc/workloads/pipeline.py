"""Pipeline-parallel training with the 1F1B schedule: several stages' micro-batch activations live at once.

A model cut into 4 stages trains on 8 micro-batches per step. Under 1F1B each stage runs a few
warm-up forwards (stage s: 3 - s of them), then alternates one forward and one backward, then
drains the remaining backwards; so stage 0 holds 4 micro-batches' activations, the last stage
one, and every stage frees a micro-batch's activations in an order interleaved with the other
stages' allocations. One process plays every stage on one device: time advances in ticks, and
in each tick every stage whose next operation's input arrived in an earlier tick runs it, as
the stages of a real pipeline would in parallel. A stage's output is handed to the next stage
as is (a real pipeline would send it to another device; here it stays live until the next
stage is done with it, which is the memory a receive buffer would take).

A stage: LayerNorm -> Linear(w, 4w) -> GELU -> Dropout -> Linear(4w, w) + residual. `size`
scales the micro-batch rows (512*size) and the width (128*size; the 4w activations are 1 MiB per
micro-batch at size 1); SGD with momentum, gradients accumulated over the micro-batches, one
optimizer step per step.
"""
from __future__ import annotations

from typing import Callable

STAGES = 4
MICRO_BATCHES = 8


def _stage(width: int):
    from torch import nn

    class Stage(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(), nn.Dropout(0.1),
                                     nn.Linear(4 * width, width))

        def forward(self, x):
            return x + self.net(x)

    return Stage()


def schedule(stage: int, stages: int = STAGES, micro: int = MICRO_BATCHES) -> list[tuple[str, int]]:
    """Stage `stage`'s operations in 1F1B order: ("F" | "B", micro-batch)."""
    warmup = min(stages - stage - 1, micro)
    ops = [("F", m) for m in range(warmup)]
    f, b = warmup, 0
    while f < micro:
        ops.append(("F", f))
        f += 1
        ops.append(("B", b))
        b += 1
    ops += [("B", m) for m in range(b, micro)]
    return ops


def run(size: int = 1, steps: int | None = None, device: str = "cpu", seed: int = 0,
        on_step: Callable[[int], None] | None = None) -> dict:
    """Trains for `steps` steps (default 2); calls on_step(i) after each. Returns, per step, the
    most micro-batches any stage held at once and the most held over all stages at once."""
    import torch

    torch.manual_seed(seed)
    width, rows = 128 * size, 512 * size
    stages = [_stage(width).to(device) for _ in range(STAGES)]
    params = [p for s in stages for p in s.parameters()]
    opt = torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    steps = 2 if steps is None else steps
    held_per_stage, held_total = [], []
    for i in range(steps):
        per_stage, total = _one_step(stages, rows, width, device)
        held_per_stage.append(per_stage)
        held_total.append(total)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if on_step:
            on_step(i)
    return {"steps": steps, "stages": STAGES, "micro_batches": MICRO_BATCHES, "rows": rows, "width": width,
            "most_in_flight_per_stage": held_per_stage, "most_in_flight_total": held_total}


def _one_step(stages, rows: int, width: int, device) -> tuple[list[int], int]:
    import torch

    plans = [schedule(s) for s in range(len(stages))]
    nxt = [0] * len(stages)
    outputs: dict[tuple[int, int], torch.Tensor] = {}  # (stage, micro) -> output, sent forward
    grads: dict[tuple[int, int], torch.Tensor] = {}    # (stage, micro) -> grad of its input, sent back
    saved: list[dict] = [{} for _ in stages]            # stage -> micro -> (input, output)
    most = [0] * len(stages)
    most_total = 0
    while any(n < len(p) for n, p in zip(nxt, plans)):
        ready_out, ready_grad = set(outputs), set(grads)  # what arrived before this tick
        for s, stage in enumerate(stages):
            if nxt[s] == len(plans[s]):
                continue
            kind, m = plans[s][nxt[s]]
            if kind == "F" and (s == 0 or (s - 1, m) in ready_out):
                x = torch.randn(rows, width, device=device) if s == 0 else outputs.pop((s - 1, m))
                x = x.detach().requires_grad_(s > 0)
                out = stage(x)
                saved[s][m] = (x, out)
                if s + 1 < len(stages):
                    outputs[(s, m)] = out.detach()
            elif kind == "B" and (s == len(stages) - 1 or (s + 1, m) in ready_grad):
                x, out = saved[s].pop(m)
                if s == len(stages) - 1:
                    out.square().mean().backward()
                else:
                    out.backward(grads.pop((s + 1, m)))
                if s > 0:
                    grads[(s, m)] = x.grad
                del x, out
            else:
                continue
            nxt[s] += 1
            most[s] = max(most[s], len(saved[s]))
        most_total = max(most_total, sum(len(v) for v in saved))
    return most, most_total
