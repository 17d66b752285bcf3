"""Meta-device initialisation as torchtitan does it, under torchrun: the model is built inside
`with torch.device("meta")` (no memory), each layer and the root fully_shard'ed (FSDP2), then
`to_empty(device="cuda")` allocates each rank's shards and `init_weights()` fills them (and
recomputes a buffer on the GPU), AdamW, 2 steps. amem's distributed tests predict it per rank
(tests/test_predict_distributed.py)."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

WIDTH, LAYERS, SEQ = 1024, 4, 64


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS))
        self.register_buffer("freqs", torch.arange(0, SEQ, 2).float(), persistent=False)
        self.seen = {"meta": (self.freqs.device.type, self.freqs.is_meta, self.layers[0].weight.is_meta)}

    def init_weights(self):
        with torch.no_grad():
            for layer in self.layers:
                torch.nn.init.trunc_normal_(layer.weight, std=0.02)
                torch.nn.init.zeros_(layer.bias)
        self.freqs = torch.arange(0, SEQ, 2, device="cuda").float()   # recomputed where the model now is

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
mesh = init_device_mesh("cuda", (dist.get_world_size(),))
with torch.device("meta"):
    model = Model()
assert model.seen["meta"] == ("meta", True, True), model.seen
for layer in model.layers:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
model.to_empty(device="cuda")
model.init_weights()
assert model.layers[0].weight.device.type == "cuda" and not model.layers[0].weight.is_meta
opt = torch.optim.AdamW(model.parameters())
for _ in range(2):
    model(torch.randn(8, WIDTH, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
