"""An FSDP1 training script as torchrun runs it: 4 Linear(1024, 1024) layers, each wrapped in
FullyShardedDataParallel (flat parameters) inside a root FSDP, AdamW, 3 steps. amem predict
refuses FSDP1 with one line and exit 4 (tests/test_predict_distributed.py)."""
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

WIDTH, LAYERS = 1024, 4

dist.init_process_group("nccl")
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)]).cuda()
model = FSDP(torch.nn.Sequential(*[FSDP(layer, device_id=local) for layer in model]), device_id=local)
opt = torch.optim.AdamW(model.parameters())
for _ in range(3):
    model(torch.randn(8, WIDTH, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
