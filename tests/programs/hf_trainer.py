"""Fine-tune a small GPT-2 with the Hugging Face Trainer on random token ids (no download:
the model comes from a config with random init, the data is made here)."""
import argparse
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class RandomTokens(Dataset):
    def __init__(self, n, seq_len, vocab_size, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab_size, (n, seq_len), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--embd", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--torch-compile", action="store_true", help="TrainingArguments(torch_compile=True)")
    parser.add_argument("--fsdp", action="store_true", help="shard with FSDP (run it under torchrun)")
    parser.add_argument("--deepspeed", metavar="CONFIG", help="DeepSpeed's JSON config, e.g. ds_zero2.json "
                        "(run it under torchrun)")
    args = parser.parse_args()

    config = GPT2Config(n_layer=args.layers, n_embd=args.embd, n_head=args.heads, vocab_size=args.vocab,
                        n_positions=args.seq,
                        bos_token_id=args.vocab - 1, eos_token_id=args.vocab - 1)
    model = GPT2LMHeadModel(config)
    print(f"parameters: {model.num_parameters():,}")
    train = RandomTokens(args.batch * args.steps * 2, args.seq, args.vocab)

    with tempfile.TemporaryDirectory() as out:
        training_args = TrainingArguments(
            output_dir=out,
            max_steps=args.steps,
            per_device_train_batch_size=args.batch,
            learning_rate=1e-4,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            bf16=args.bf16,
            gradient_checkpointing=args.gradient_checkpointing,
            dataloader_num_workers=args.workers,
            use_cpu=args.cpu,
            disable_tqdm=True,
            fsdp=args.fsdp,
            fsdp_config={"version": 2, "transformer_layer_cls_to_wrap": ["GPT2Block"]} if args.fsdp else None,
            deepspeed=args.deepspeed,
            torch_compile=args.torch_compile,
        )
        trainer = Trainer(model=model, args=training_args, train_dataset=train)
        result = trainer.train()
    print(f"train loss {result.training_loss:.4f}")


if __name__ == "__main__":
    main()
