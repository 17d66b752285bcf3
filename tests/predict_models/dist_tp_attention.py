"""Tensor-parallel attention as pytorch/examples' tensor_parallelism/fsdp_tp_example.py runs it:
the mesh made by init_device_mesh alone (no init_process_group: DeviceMesh starts the default group
itself), q, k and v projections ColwiseParallel(use_local_output=False), so scaled_dot_product_attention
takes DTensors (heads sharded), the output projection RowwiseParallel; bf16, causal, one
forward and backward. Predicted per rank by tests/test_predict_distributed.py."""
import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

BATCH, TOKENS, HEADS, HEAD_DIM = 2, 256, 8, 64
WIDTH = HEADS * HEAD_DIM


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(4))

    def forward(self, x):
        heads = lambda t: t.view(BATCH, TOKENS, -1, HEAD_DIM).transpose(1, 2)   # noqa: E731 (-1: this rank's)
        q, k, v = heads(self.wq(x)), heads(self.wk(x)), heads(self.wv(x))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(BATCH, TOKENS, -1))


mesh = init_device_mesh("cuda", (torch.cuda.device_count(),), mesh_dim_names=("tp",))
model = Attention().cuda().to(torch.bfloat16)
parallelize_module(model, mesh, {"wq": ColwiseParallel(use_local_output=False),
                                 "wk": ColwiseParallel(use_local_output=False),
                                 "wv": ColwiseParallel(use_local_output=False), "wo": RowwiseParallel()})
x = torch.randn(BATCH, TOKENS, WIDTH, device="cuda", dtype=torch.bfloat16)
model(x).float().square().mean().backward()
