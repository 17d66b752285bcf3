"""A program that starts torchrun's agent on a function of its own, as accelerate's
`notebook_launcher` does: `elastic_launch(LaunchConfig(nproc_per_node=2, ...), train)()`, where
`train` is dist_ops.py's body. Predicted by tests/test_predict_spawn.py."""
import os

import torch
import torch.distributed as dist
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

import op_library  # noqa: F401 (defines torch.ops.amem_test_ops.doubled)


def train():
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    x = torch.ones(256, 1024, device="cuda")
    y = torch.ops.amem_test_ops.doubled(x)
    print(f"rank {dist.get_rank()}: doubled {tuple(y.shape)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id="agent_function",
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0")
    elastic_launch(config, train)()
    print("the agent returned")
