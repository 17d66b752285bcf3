"""Barriers as torchtitan and DDP scripts make them under torchrun: `dist.barrier(device_ids=[...])`
(c10d's C++ makes a one-byte tensor on that device) and a plain one on an NCCL group; monitored
barriers on a gloo group, as Lightning's `_InfiniteBarrier` makes them (no device memory). amem's
distributed tests predict it per rank (tests/test_predict_distributed.py)."""
import os

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
x = torch.ones(1024, device="cuda")
dist.barrier(device_ids=[int(os.environ["LOCAL_RANK"])])
dist.all_reduce(x)
dist.barrier()
gloo = dist.new_group(backend="gloo")
gloo.monitored_barrier()
dist.monitored_barrier(gloo, wait_all_ranks=True)
print("monitored barriers passed")
dist.destroy_process_group()
