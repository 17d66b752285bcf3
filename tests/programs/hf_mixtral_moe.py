"""A plain training loop over a small Hugging Face Mixtral (mixture of experts: each token routed to
the top 2 of 8 experts), AdamW, the model in bfloat16 (torch's grouped_mm takes bf16 only).
`--experts eager` runs transformers' per-expert loop (one pass per expert hit, each on the tokens
routed to it); the default, `grouped_mm`, sorts the tokens by expert and runs every expert in one
grouped matmul. Random init from a config; random token ids."""
import argparse
import time

import torch
from transformers import MixtralConfig, MixtralForCausalLM


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--intermediate", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--experts", default="grouped_mm", choices=["eager", "grouped_mm"])
    parser.add_argument("--num-experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()

    config = MixtralConfig(hidden_size=args.hidden, intermediate_size=args.intermediate,
                           num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=2,
                           num_local_experts=args.num_experts, num_experts_per_tok=args.top_k,
                           vocab_size=args.vocab, max_position_embeddings=args.seq,
                           attn_implementation="sdpa", experts_implementation=args.experts)
    model = MixtralForCausalLM(config).to(args.device, getattr(torch, args.dtype))
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    print(f"parameters: {sum(p.numel() for p in model.parameters()):,}; experts: "
          f"{model.config._experts_implementation}")

    for step in range(args.steps):
        t0 = time.time()
        input_ids = torch.randint(0, args.vocab, (args.batch, args.seq), device=args.device)
        loss = model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}: loss {loss.item():.4f} ({(time.time() - t0) * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
