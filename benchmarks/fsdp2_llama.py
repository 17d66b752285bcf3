"""An FSDP2 training program: the LLaMA of amem_alloc/workloads/llama.py, each block checkpointed
(torch.utils.checkpoint, non-reentrant) and `fully_shard`ed with a bf16 MixedPrecisionPolicy
(fp32 master weights, gradients reduced in fp32), the root sharded too, AdamW. The model is made
on the meta device and materialised shard by shard (`to_empty`), as large FSDP jobs do; values are
left uninitialised (what the program allocates does not depend on them).

    torchrun --nproc-per-node 8 benchmarks/fsdp2_llama.py [--config 7b|small|tiny] [--steps N]

amem predicts it as `amem predict -- torchrun ...`; benchmarks/bench_fsdp_tracker.py runs
`build` and `train_step` under torch's FSDPMemTracker too (the same code on both sides), and
benchmarks/bench_predict_fsdp.py predicts the 7B step on 8 ranks.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from amem_alloc.workloads import llama  # noqa: E402

CONFIGS = {"7b": llama.LLAMA_7B,
           "small": llama.LlamaConfig(layers=4, d_model=2048, heads=16, d_ff=5504, vocab=32000, seq=2048),
           "tiny": llama.TINY}


class Checkpointed(torch.nn.Module):
    """A block whose activations are recomputed in backward."""

    def __init__(self, block: torch.nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.block, *args, use_reentrant=False)


def build(cfg: llama.LlamaConfig, device: str, mesh) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    with torch.device("meta"):
        model = llama._model(cfg)
    model.blocks = torch.nn.ModuleList(Checkpointed(b) for b in model.blocks)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    model.to_empty(device=device)
    # foreach=True is what AdamW picks by default for CUDA parameters; said here so that a run on
    # CPU tensors (FSDPMemTracker's in bench_fsdp_tracker.py, where the default is the for-loop)
    # runs the same kernels and holds the same temporaries
    return model, torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=True)


def train_step(model, opt, cfg: llama.LlamaConfig, device: str, batch: int = 1) -> None:
    tokens = torch.randint(cfg.vocab, (batch, cfg.seq + 1), device=device)
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.float().view(-1, cfg.vocab), tokens[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def main() -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="7b", choices=sorted(CONFIGS))
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    cfg = CONFIGS[args.config]
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    model, opt = build(cfg, "cuda", mesh)
    for _ in range(args.steps):
        train_step(model, opt, cfg, "cuda", args.batch)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
