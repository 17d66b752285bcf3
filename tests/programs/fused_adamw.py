"""A small transformer encoder trained with AdamW's fused (or foreach) implementation and gradient
clipping."""
import argparse

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, vocab, d_model, heads, layers, classes):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=4 * d_model, dropout=0.1,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, ids):
        return self.head(self.encoder(self.embed(ids)).mean(dim=1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--impl", choices=["fused", "foreach"], default="fused")
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()

    model = Model(args.vocab, args.d_model, args.heads, args.layers, 2).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, **{args.impl: True})
    for step in range(args.steps):
        ids = torch.randint(0, args.vocab, (args.batch, args.seq), device=args.device)
        target = torch.randint(0, 2, (args.batch,), device=args.device)
        loss = nn.functional.cross_entropy(model(ids), target)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step}: loss {loss.item():.4f} grad norm {norm.item():.3f}")


if __name__ == "__main__":
    main()
