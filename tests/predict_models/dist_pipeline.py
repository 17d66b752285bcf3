"""A 2-stage pipeline as torchrun runs it: each rank's stage is LAYERS_PER_STAGE Linear(1024, 1024)
layers, ScheduleGPipe over MICROBATCHES micro-batches of a batch of BATCH, AdamW, 3 steps. Every
stage gets full static metadata (input/output args and grads), which torch's fake process group
requires (schedules.py refuses dynamic shape inference on it). Predicted per rank by
tests/test_predict_distributed.py."""
import inspect
import os

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

WIDTH, LAYERS_PER_STAGE, BATCH, MICROBATCHES = 1024, 2, 32, 4

dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(device)
stage_module = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS_PER_STAGE)]).to(device)
micro = torch.empty(BATCH // MICROBATCHES, WIDTH, device=device)
# torch 2.14 takes the gradients' metadata too (and needs it on the fake group); 2.11 has no such arguments
grads = {"input_grads": (micro,), "output_grads": (micro,)} if "input_grads" in inspect.signature(PipelineStage).parameters else {}
stage = PipelineStage(stage_module, rank, world, device, input_args=(micro,), output_args=(micro,), **grads)
last = rank == world - 1
schedule = ScheduleGPipe(stage, MICROBATCHES, loss_fn=lambda out, target: out.square().mean())  # every rank: it turns backward on
opt = torch.optim.AdamW(stage_module.parameters())
for _ in range(3):
    x = torch.randn(BATCH, WIDTH, device=device)
    if rank == 0:
        schedule.step(x)
    elif last:
        schedule.step(target=x)
    else:
        schedule.step()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
