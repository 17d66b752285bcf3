"""Tensor parallelism as torchrun runs it: an MLP (Linear(1024, 4096), ReLU, Linear(4096, 1024)),
ColwiseParallel then RowwiseParallel over a "tp" mesh dimension (MESH=tp: the whole world;
MESH=2d: a (dp=2, tp=world/2) mesh with fully_shard over "dp" after the plan), SEQUENCE=1 adds
sequence parallelism (input sharded on the sequence, SequenceParallel-style all-gather before the
first Linear and reduce-scatter after the second), AdamW, 3 steps. Predicted per rank by
tests/test_predict_distributed.py."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

WIDTH, HIDDEN, TOKENS = 1024, 4096, 64

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
world = dist.get_world_size()
two_d = os.environ.get("MESH") == "2d"
sequence = os.environ.get("SEQUENCE") == "1"
mesh = init_device_mesh("cuda", (2, world // 2) if two_d else (world,), mesh_dim_names=("dp", "tp") if two_d else ("tp",))
model = torch.nn.Sequential(torch.nn.Linear(WIDTH, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, WIDTH)).cuda()
if sequence:
    plan = {"0": ColwiseParallel(input_layouts=Shard(0)), "2": RowwiseParallel(output_layouts=Shard(0))}
else:
    plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
parallelize_module(model, mesh["tp"], plan)
if two_d:
    from torch.distributed.fsdp import fully_shard
    fully_shard(model, mesh=mesh["dp"])
opt = torch.optim.AdamW(model.parameters())
tp = mesh["tp"].size()
for _ in range(3):
    x = torch.randn(TOKENS // tp if sequence else TOKENS, WIDTH, device="cuda")
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
