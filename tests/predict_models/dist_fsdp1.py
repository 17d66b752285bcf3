"""An FSDP1 training script as torchrun runs it: 4 residual MLP blocks (Linear(1000, 1001), ReLU,
Linear(1001, 1000)) and a LayerNorm, built on the CPU and given to FullyShardedDataParallel with
`device_id` (flat parameters, one per wrapped unit), AdamW, 3 steps. amem's distributed tests
predict it per rank (tests/test_predict_distributed.py). Settings from the environment:
STRATEGY (a ShardingStrategy name, FULL_SHARD by default), WRAP (`transformer`: each block is a
unit, the default; `size`: size_based_auto_wrap_policy, each Linear is), ORIG=1 (use_orig_params),
MIXED=1 (MixedPrecision with bf16 parameters, reductions and buffers), OFFLOAD=1
(CPUOffload(offload_params=True))."""
import functools
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

WIDTH, HIDDEN, LAYERS = 1000, 1001, 4


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(WIDTH, HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, WIDTH)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = torch.nn.LayerNorm(WIDTH)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
if os.environ.get("WRAP", "transformer") == "size":
    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=WIDTH * HIDDEN)
else:
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
bf16 = torch.bfloat16
model = FSDP(Net(), auto_wrap_policy=policy, device_id=torch.cuda.current_device(),
             sharding_strategy=ShardingStrategy[os.environ.get("STRATEGY", "FULL_SHARD")],
             use_orig_params=os.environ.get("ORIG") == "1",
             mixed_precision=MixedPrecision(bf16, bf16, bf16) if os.environ.get("MIXED") == "1" else None,
             cpu_offload=CPUOffload(offload_params=True) if os.environ.get("OFFLOAD") == "1" else None)
opt = torch.optim.AdamW(model.parameters())
for _ in range(3):
    model(torch.randn(8, WIDTH, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
