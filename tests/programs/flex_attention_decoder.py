"""A decoder-only transformer whose attention is FlexAttention (torch.nn.attention.flex_attention),
compiled as its documentation advises, with a causal block mask from create_block_mask; bf16
autocast, AdamW, a few training steps on random token ids. What torchtitan's Llama models run by
default, in a program of its own."""
import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

flex = torch.compile(flex_attention)


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


class Block(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.RMSNorm(d_model), nn.RMSNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.up = nn.Linear(d_model, 4 * d_model, bias=False)
        self.down = nn.Linear(4 * d_model, d_model, bias=False)

    def forward(self, x, block_mask):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        y = flex(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=block_mask)
        x = x + self.proj(y.transpose(1, 2).reshape(b, s, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Decoder(nn.Module):
    def __init__(self, vocab, d_model, heads, layers):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.norm = nn.RMSNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, ids, block_mask):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, block_mask)
        return self.head(self.norm(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()

    model = Decoder(args.vocab, args.d_model, args.heads, args.layers).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    block_mask = create_block_mask(causal, B=None, H=None, Q_LEN=args.seq, KV_LEN=args.seq, device=args.device)
    for step in range(args.steps):
        ids = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=args.device)
        with torch.autocast(args.device, dtype=torch.bfloat16):
            logits = model(ids[:, :-1], block_mask)
        loss = F.cross_entropy(logits.float().view(-1, args.vocab), ids[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
