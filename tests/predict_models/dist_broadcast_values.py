"""Broadcasts whose values the ranks read, as libraries do to check that the ranks agree: rank 0
sends [7, 8, 9] where the others put -1 (DeepSpeed ZeRO-3's assert_ints_same_as_other_ranks), then
rank 1 sends its own number on a group of ranks 0 and 1. Every rank prints what it received."""
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank = dist.get_rank()
ids = torch.tensor([7, 8, 9] if rank == 0 else [-1, -1, -1], device="cuda")
dist.broadcast(ids, src=0)
pair = dist.new_group([0, 1])
mine = torch.tensor([10 + rank], device="cuda")
dist.broadcast(mine, src=1, group=pair)
print(f"rank {rank} received {ids.tolist()} and {mine.tolist()}")
