"""A torchrun script that uses an operator its library defines at import (op_library.py): one
1 MiB tensor doubled by it on each rank (`train`, which agent_function.py also hands to torchrun's
agent). Predicted by tests/test_predict_spawn.py."""
import os

import torch
import torch.distributed as dist

import op_library  # noqa: F401 (defines torch.ops.amem_test_ops.doubled)


def train():
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    x = torch.ones(256, 1024, device="cuda")
    y = torch.ops.amem_test_ops.doubled(x)
    print(f"rank {dist.get_rank()}: doubled {tuple(y.shape)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    train()
