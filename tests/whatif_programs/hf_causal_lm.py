"""A GPT-2 causal LM (from a config, random init) trained with AdamW for a few steps, optionally
under bf16 autocast; `--gradient-checkpointing` calls the model's own
gradient_checkpointing_enable(use_reentrant=False) (what `amem predict --what-if checkpoint=blocks`
must match). The config leaves `use_cache` at GPT2Config's default (True), as a user's config
does: the model's own checkpointing turns the KV cache off, and so must the what-if.
The defaults are small; GPT-2 small is `--layers 12 --embd 768 --heads 12 --vocab 50257 --seq 1024`.
Runs on a GPU as written."""
import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--bf16", action="store_true", help="forward and loss under bf16 autocast")
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    config = GPT2Config(n_layer=a.layers, n_embd=a.embd, n_head=a.heads, n_positions=a.seq, vocab_size=a.vocab,
                        bos_token_id=a.vocab - 1, eos_token_id=a.vocab - 1)
    model = GPT2LMHeadModel(config).to(a.device).train()
    if a.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(a.steps):
        ids = torch.randint(0, config.vocab_size, (a.batch, a.seq), device=a.device)
        with torch.autocast(a.device.split(":")[0], dtype=torch.bfloat16, enabled=a.bf16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    main()
