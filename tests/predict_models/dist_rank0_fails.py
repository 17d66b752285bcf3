"""A job whose rank 0 fails after allocating (each rank records a few thousand allocations first,
so a rank's recording is far larger than a pipe holds): predicted with no ranks named, rank 0 is
recorded here while a forked worker records the last rank. Used by tests/test_predict_distributed.py."""
import os

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
kept = [torch.empty(1024, device="cuda") for _ in range(3000)]
if dist.get_rank() == 0:
    raise ValueError("rank 0 stops here")
dist.destroy_process_group()
