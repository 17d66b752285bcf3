"""A small transformer classifier trained with PyTorch Lightning's Trainer (one GPU, or DDP/FSDP
under torchrun: Lightning reads torchrun's environment), AdamW, random token data."""
import argparse

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(L.LightningModule):
    def __init__(self, vocab, d_model, heads, layers, classes):
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=4 * d_model, dropout=0.0,
                                       batch_first=True, norm_first=True) for _ in range(layers))
        self.head = nn.Linear(d_model, classes)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=1))

    def training_step(self, batch, batch_idx):
        ids, target = batch
        loss = nn.functional.cross_entropy(self(ids), target)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="auto", help="auto, ddp or fsdp")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--precision", default="32-true", help="32-true, bf16-mixed, 16-mixed ...")
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--compile", action="store_true", help="torch.compile the LightningModule")
    args = parser.parse_args()

    g = torch.Generator().manual_seed(0)
    n = args.batch * args.steps * args.accumulate * max(args.devices, 1)
    data = TensorDataset(torch.randint(0, args.vocab, (n, args.seq), generator=g),
                         torch.randint(0, 2, (n,), generator=g))
    model = Classifier(args.vocab, args.d_model, args.heads, args.layers, 2)
    if args.compile:   # Lightning takes the compiled module apart and compiles its steps itself
        model = torch.compile(model)
    strategy = args.strategy
    if strategy == "fsdp":
        from lightning.pytorch.strategies import FSDPStrategy
        strategy = FSDPStrategy(auto_wrap_policy={nn.TransformerEncoderLayer})
    trainer = L.Trainer(accelerator="cpu" if args.cpu else "gpu", devices=args.devices, strategy=strategy,
                        precision=args.precision, max_steps=args.steps,
                        accumulate_grad_batches=args.accumulate, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, DataLoader(data, batch_size=args.batch))
    print(f"trained {trainer.global_step} steps; loss {trainer.callback_metrics['train_loss'].item():.4f}")


if __name__ == "__main__":
    main()
