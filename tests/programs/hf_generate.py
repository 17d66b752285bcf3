"""Text generation with a Hugging Face Llama (random init from a config, bf16 weights): greedy
generate() with its KV cache for a fixed number of new tokens, a batch of random prompts. The
inference path: no gradients, a cache that grows by one token per step."""
import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=2816)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()

    config = LlamaConfig(hidden_size=args.hidden, intermediate_size=args.intermediate,
                         num_hidden_layers=args.layers, num_attention_heads=16, num_key_value_heads=4,
                         vocab_size=args.vocab, max_position_embeddings=args.prompt + args.new_tokens,
                         attn_implementation="sdpa", bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(config).to(device=args.device, dtype=torch.bfloat16).eval()
    prompts = torch.randint(3, args.vocab, (args.batch, args.prompt), device=args.device)
    with torch.inference_mode():
        out = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=args.new_tokens,
                             min_new_tokens=args.new_tokens, do_sample=False)
    print(f"generated {out.shape[1] - args.prompt} tokens for {out.shape[0]} prompts")


if __name__ == "__main__":
    main()
