"""torch's ZeroRedundancyOptimizer sharding AdamW's state over 2 ranks, then consolidated on rank
0 for a checkpoint (`consolidate_state_dict(to=0)`, its own object broadcast of each shard) and
its state_dict read there. Rank 0 prints what it holds: its own shard's states, and every
parameter group of the whole. Run per rank under `amem predict --nproc-per-node 2`."""
import os

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).cuda()
optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3)
model(torch.randn(16, 256, device="cuda")).sum().backward()
optimizer.step()
optimizer.consolidate_state_dict(to=0)
if dist.get_rank() == 0:
    state = optimizer.state_dict()
    print(f"consolidated: {len(state['state'])} states, {len(state['param_groups'][0]['params'])} parameters")
dist.destroy_process_group()
