"""A small MLP trained from a DataLoader with two worker processes, pinned memory, shuffling and
a custom collate_fn; batches go to the GPU with non_blocking=True."""
import argparse

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Synthetic(Dataset):
    """Feature vectors made from numpy on the fly, as a user's preprocessing would."""

    def __init__(self, n, features, classes):
        self.n, self.features, self.classes = n, features, classes

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        x = rng.standard_normal(self.features).astype(np.float32)
        return x, int(rng.integers(self.classes))


def collate(samples):
    xs, ys = zip(*samples)
    return {"x": torch.from_numpy(np.stack(xs)), "y": torch.tensor(ys, dtype=torch.long)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--features", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()

    loader = DataLoader(Synthetic(args.samples, args.features, args.classes), batch_size=args.batch,
                        shuffle=True, num_workers=args.workers, pin_memory=True, collate_fn=collate,
                        persistent_workers=False)
    model = nn.Sequential(nn.Linear(args.features, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.classes)).to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        total, seen = 0.0, 0
        for batch in loader:
            x = batch["x"].to(args.device, non_blocking=True)
            y = batch["y"].to(args.device, non_blocking=True)
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(y)
            seen += len(y)
        print(f"epoch {epoch}: mean loss {total / seen:.4f}")


if __name__ == "__main__":
    main()
