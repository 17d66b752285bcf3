"""DeepSpeed ZeRO (stage from ZERO: 1, 2 or 3) through `deepspeed.initialize`: bf16, torch's AdamW
("torch_adam"; TORCH_ADAM=0: DeepSpeed's default, its FusedAdam, whose CUDA op is built for a GPU),
every other setting DeepSpeed's default. The layers' sizes make the flat buffer need padding (2,012,010 parameters). Run it with
torchrun (or under `amem predict -- torchrun --nproc-per-node N dist_deepspeed.py`)."""
import os

import deepspeed
import torch
from torch import nn

WIDTH, CLASSES, BATCH = 1000, 10, 8

model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH), nn.GELU(),
                      nn.Linear(WIDTH, CLASSES))
config = {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
          "bf16": {"enabled": True},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": os.environ.get("TORCH_ADAM", "1") == "1"}},
          "zero_optimization": {"stage": int(os.environ.get("ZERO", "1"))}}
engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
for step in range(3):
    x = torch.randn(BATCH, WIDTH, device=engine.device, dtype=torch.bfloat16)
    y = torch.randint(0, CLASSES, (BATCH,), device=engine.device)
    loss = nn.functional.cross_entropy(engine(x).float(), y)
    engine.backward(loss)
    engine.step()
