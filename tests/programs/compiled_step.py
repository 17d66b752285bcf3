"""torch.compile: a compiled model and a compiled optimizer step, a few training steps."""
import argparse

import torch
from torch import nn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()

    layers = []
    for _ in range(args.depth):
        layers += [nn.Linear(args.width, args.width), nn.LayerNorm(args.width), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(args.width, 1)).to(args.device)
    compiled = torch.compile(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    @torch.compile(fullgraph=False)
    def optimizer_step():
        optimizer.step()

    for step in range(args.steps):
        x = torch.randn(args.batch, args.width, device=args.device)
        y = torch.randn(args.batch, 1, device=args.device)
        loss = nn.functional.mse_loss(compiled(x), y)
        loss.backward()
        optimizer_step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
