"""A program that starts torchrun's agent on a function of its own, as accelerate's
`notebook_launcher` does: `elastic_launch(LaunchConfig(nproc_per_node=2, ...), train)()`, where
`train` is dist_ops.py's. Predicted by tests/test_predict_spawn.py."""
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from dist_ops import train

if __name__ == "__main__":
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id="agent_function",
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0")
    elastic_launch(config, train)()
    print("the agent returned")
