"""A plain training loop on Hugging Face accelerate: bf16 mixed precision, accelerator.backward,
gradient accumulation with accelerator.accumulate, a DataLoader prepared by accelerate. One GPU,
or DDP under torchrun."""
import argparse

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--accumulate", type=int, default=2)
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args()

    accelerator = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=args.accumulate, cpu=args.cpu)
    layers = []
    for _ in range(args.depth):
        layers += [nn.Linear(args.width, args.width), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(args.width, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    n = args.batch * args.steps * args.accumulate * accelerator.num_processes
    data = TensorDataset(torch.randn(n, args.width), torch.randint(0, 10, (n,)))
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=args.batch))
    for i, (x, y) in enumerate(loader):
        with accelerator.accumulate(model):
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        accelerator.print(f"batch {i}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
