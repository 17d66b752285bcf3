"""A plain training loop on Lightning Fabric (one GPU, or DDP/FSDP under torchrun): bf16 mixed
precision, gradient accumulation without gradient sync between micro-batches, AdamW."""
import argparse

import torch
from lightning.fabric import Fabric
from torch import nn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="auto", help="auto, ddp or fsdp")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--accumulate", type=int, default=2)
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args()

    fabric = Fabric(accelerator="cpu" if args.cpu else "cuda", devices=args.devices, strategy=args.strategy,
                    precision=args.precision)
    fabric.launch()
    layers = []
    for _ in range(args.depth):
        layers += [nn.Linear(args.width, args.width), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(args.width, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = fabric.setup(model, optimizer)
    for step in range(args.steps):
        for micro in range(args.accumulate):
            x = torch.randn(args.batch, args.width, device=fabric.device)
            y = torch.randint(0, 10, (args.batch,), device=fabric.device)
            with fabric.no_backward_sync(model, enabled=micro < args.accumulate - 1):
                loss = nn.functional.cross_entropy(model(x), y) / args.accumulate
                fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        fabric.print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
