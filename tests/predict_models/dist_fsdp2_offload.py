"""An FSDP2 training script with CPU offload, as torchrun runs it: 4 Linear(1024, 1024) layers, each
fully_shard'ed with CPUOffloadPolicy (sharded parameters, gradients and optimizer state on the CPU),
AdamW, 3 steps. amem's distributed tests predict it per rank (tests/test_predict_distributed.py)."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

WIDTH, LAYERS = 1024, 4

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
mesh = init_device_mesh("cuda", (dist.get_world_size(),))
model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
for layer in model:
    fully_shard(layer, mesh=mesh, offload_policy=CPUOffloadPolicy())
fully_shard(model, mesh=mesh, offload_policy=CPUOffloadPolicy())
opt = torch.optim.AdamW(model.parameters())
for _ in range(3):
    model(torch.randn(8, WIDTH, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
