"""A DDP training script as torchrun runs it: 4 Linear(1024, 1024) layers, AdamW, 3 steps;
GRAD_VIEW=1 sets gradient_as_bucket_view; HOOK=allreduce|fp16 registers torch's own comm hook
(default_hooks.allreduce_hook / fp16_compress_hook); DESTROY=1 destroys the process group at
the end, as nanoGPT's train.py does. Predicted per rank by tests/test_predict_distributed.py."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

WIDTH, LAYERS = 1024, 4

dist.init_process_group("nccl")
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)]).cuda()
model = DDP(model, device_ids=[local], gradient_as_bucket_view=os.environ.get("GRAD_VIEW") == "1")
HOOKS = {"allreduce": "allreduce_hook", "fp16": "fp16_compress_hook"}
if os.environ.get("HOOK"):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model.register_comm_hook(None, getattr(default_hooks, HOOKS[os.environ["HOOK"]]))
opt = torch.optim.AdamW(model.parameters())
for _ in range(3):
    model(torch.randn(8, WIDTH, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
if os.environ.get("DESTROY") == "1":
    dist.destroy_process_group()
