"""Object collectives sized by what they carry, as a trainer uses them: rank 0 broadcasts a setting
that every rank computed alike (PyTorch Lightning broadcasts its log folder so), every rank
all-gathers and gathers its own. Each allocation's KiB is what the rank holds after the call; the
ranks' programs are equal (the gather only checks what rank 0 received). Run per rank under `amem predict --nproc-per-node 2`."""
import os

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
world = dist.get_world_size()

setting = [17]                                   # every rank computed the same value
dist.broadcast_object_list(setting, src=0)
torch.empty(setting[0] * 256, device="cuda")    # 17 KiB

gathered = [None] * world
dist.all_gather_object(gathered, 19)
torch.empty(sum(gathered) * 256, device="cuda")  # 19 KiB per rank

at_zero = [None] * world if dist.get_rank() == 0 else None
dist.gather_object(23, at_zero, dst=0)
assert at_zero is None or at_zero == [23] * world
dist.destroy_process_group()
