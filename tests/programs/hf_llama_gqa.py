"""A plain training loop over a Hugging Face Llama with grouped-query attention (16 query heads,
4 key/value heads), bf16 autocast and AdamW. Random init from a config; random token ids."""
import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=2816)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()

    config = LlamaConfig(hidden_size=args.hidden, intermediate_size=args.intermediate,
                         num_hidden_layers=args.layers, num_attention_heads=16, num_key_value_heads=4,
                         vocab_size=args.vocab, max_position_embeddings=args.seq,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config).to(args.device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    print(f"parameters: {sum(p.numel() for p in model.parameters()):,}")

    for step in range(args.steps):
        t0 = time.time()
        input_ids = torch.randint(0, args.vocab, (args.batch, args.seq), device=args.device)
        with torch.autocast(args.device, dtype=torch.bfloat16):
            loss = model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}: loss {loss.item():.4f} ({(time.time() - t0) * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
