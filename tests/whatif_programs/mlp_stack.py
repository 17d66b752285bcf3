"""A deep stack of identical MLP blocks trained with AdamW; `--checkpoint` applies activation
checkpointing by hand (what `amem predict --what-if checkpoint=...` must match):
  none    no checkpointing
  blocks  torch.utils.checkpoint around every block
  sqrt    one checkpoint around each segment of round(sqrt(L)) consecutive blocks
Runs on a GPU as written (`--device cpu` on a CPU)."""
import argparse
import math

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


class Stack(nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x, scheme: str = "none"):
        blocks = list(self.blocks)
        size = max(1, round(math.sqrt(len(blocks)))) if scheme == "sqrt" else 1
        for start in range(0, len(blocks), size):
            segment = blocks[start:start + size]

            def run(h, segment=segment):
                for b in segment:
                    h = b(h)
                return h
            x = checkpoint(run, x, use_reentrant=False) if scheme != "none" else run(x)
        return self.head(x).mean()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--depth", type=int, default=16)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--checkpoint", choices=["none", "blocks", "sqrt"], default="none")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    model = Stack(a.width, a.depth).to(a.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(a.steps):
        x = torch.randn(a.batch, a.width, device=a.device)
        loss = model(x, a.checkpoint)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)


if __name__ == "__main__":
    main()
