"""A small GPT-2 causal LM (from a config, random init) trained with AdamW for a few steps;
`--gradient-checkpointing` calls the model's own gradient_checkpointing_enable() (what
`amem predict --what-if checkpoint=blocks` must match). Runs on a GPU as written."""
import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    config = GPT2Config(n_layer=a.layers, n_embd=a.embd, n_head=4, n_positions=a.seq, vocab_size=8192,
                        use_cache=False)
    model = GPT2LMHeadModel(config).to(a.device).train()
    if a.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(a.steps):
        ids = torch.randint(0, config.vocab_size, (a.batch, a.seq), device=a.device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    main()
