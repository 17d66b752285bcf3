"""A DDP script that starts its own processes, as pytorch/examples' DDP tutorial (multigpu.py)
does: `torch.multiprocessing.spawn(train, args=(world,), nprocs=world)` with world = the GPUs seen
(NPROCS=N: a fixed N), each process on GPU `rank`, joining the group with its rank and world size;
4 Linear(1024, 1024) layers, AdamW, 3 steps. `direct` as the first argument: no spawn, the body
run once for torchrun's rank (LOCAL_RANK), the same program. JOIN=0 spawns with join=False, joins,
then reads the results only rank 0 put on a queue (as Lightning's ddp_spawn launcher does); FAIL=1
makes the spawned function raise its own error. Predicted by
tests/test_predict_spawn.py."""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

WIDTH, LAYERS = 1024, 4


def train(rank: int, world: int, results=None) -> None:
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "12355")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    print(f"process {rank}: rank {dist.get_rank()} of {dist.get_world_size()} on cuda:{torch.cuda.current_device()}")
    if os.environ.get("FAIL") == "1":
        raise ValueError("the script's own error in the spawned function")
    model = DDP(torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)]).cuda(), device_ids=[rank])
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(3):
        model(torch.randn(8, WIDTH, device="cuda")).sum().backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()
    if results is not None and rank == 0:
        results.put("rank 0's results")   # only rank 0 answers; the parent waits for it (Lightning's ddp_spawn)


if __name__ == "__main__":
    if sys.argv[1:] == ["direct"]:
        train(int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"]))
    else:
        world = int(os.environ.get("NPROCS") or torch.cuda.device_count())
        if os.environ.get("JOIN") == "0":
            results = mp.get_context("spawn").SimpleQueue()
            context = mp.spawn(train, args=(world, results), nprocs=world, join=False)
            while not context.join():
                pass
            print(results.get())
        else:
            mp.spawn(train, args=(world,), nprocs=world)
        print("all processes ended")
