"""LoRA fine-tuning with Hugging Face peft: a GPT-2 whose attention projections get rank-r adapters,
the base model frozen, AdamW on the adapters only, bf16 autocast. Runs on a GPU, or with --cpu."""
import argparse

import torch
from peft import LoraConfig, get_peft_model
from transformers import GPT2Config, GPT2LMHeadModel


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--embd", type=int, default=512)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args()
    device = "cpu" if args.cpu else "cuda"

    config = GPT2Config(n_layer=args.layers, n_embd=args.embd, n_head=8, vocab_size=8000, n_positions=args.seq)
    model = get_peft_model(GPT2LMHeadModel(config).to(device),
                           LoraConfig(r=args.rank, lora_alpha=2 * args.rank, target_modules=["c_attn"],
                                      fan_in_fan_out=True))
    model.print_trainable_parameters()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    for step in range(args.steps):
        tokens = torch.randint(0, config.vocab_size, (args.batch, args.seq), device=device)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"step {step}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
