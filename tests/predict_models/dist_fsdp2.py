"""An FSDP2 training script as torchrun runs it: 4 Linear(1024, 1024) layers, each fully_shard'ed,
AdamW, 3 steps; OFFLOAD=1 shards with CPUOffloadPolicy (sharded parameters, gradients and optimizer
state on the CPU; the model is not moved to the GPU). amem's distributed tests predict it per rank
(tests/test_predict_distributed.py)."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

WIDTH, LAYERS = 1024, 4
OFFLOAD = os.environ.get("OFFLOAD") == "1"

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
mesh = init_device_mesh("cuda", (dist.get_world_size(),))
model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
model = model if OFFLOAD else model.cuda()
policy = {"offload_policy": CPUOffloadPolicy()} if OFFLOAD else {}
for layer in model:
    fully_shard(layer, mesh=mesh, **policy)
fully_shard(model, mesh=mesh, **policy)
opt = torch.optim.AdamW(model.parameters())
for _ in range(3):
    model(torch.randn(8, WIDTH, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
