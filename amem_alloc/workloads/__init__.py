"""Workloads: real torch models for `amem compare`, and a synthetic allocation pattern for `amem demo`.

Each bundled workload is run(size=1, steps=None, device="cpu", seed=0, on_step=None) -> dict:
a real model that calls on_step(i) after each step; all but llama7b are small enough for a CPU at
size 1 (llama7b is 7e9 parameters: for `amem predict`, which runs nothing). Workloads with more
than one stream use workloads/streams.py, which works on CUDA and on the CPU.
training_events() is the synthetic pattern (no torch) that `amem demo` allocates.
"""
from . import decode, fsdp, gpt, llama, mlp, moe, pipeline, serving
from .training import training_events

# name -> (run function, what it is)
WORKLOADS = {
    "gpt": (gpt.run, "GPT-style decoder trained with a random sequence length each step"),
    "mlp": (mlp.run, "deep MLP (batch 64, width 1024, 16 layers), no checkpointing"),
    "mlp-checkpoint": (mlp.run_checkpointed, "the same MLP with activation checkpointing (4 segments)"),
    "decode": (decode.run, "autoregressive decoding with a key/value cache grown by torch.cat"),
    "fsdp": (fsdp.run, "FSDP-style training: each layer's parameters all-gathered on a communication stream, "
                       "used and freed on the compute stream (record_stream), forward and backward"),
    "moe": (moe.run, "mixture-of-experts training: a different number of tokens per expert every step"),
    "pipeline": (pipeline.run, "pipeline-parallel training, 4 stages x 8 micro-batches in the 1F1B schedule"),
    "serving": (serving.run, "LLM serving: continuous batching, per-request key/value caches that grow and are "
                             "freed as requests finish"),
    "llama7b": (llama.run, "LLaMA-7B-shaped decoder (32 layers, d_model 4096, seq 2048), AdamW, bf16 autocast; "
                "size = batch; for amem predict (too big for a CPU run)"),
}


def get(name: str):
    """The run function of a bundled workload; ValueError naming the choices."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")
    return WORKLOADS[name][0]


__all__ = ["WORKLOADS", "get", "training_events"]
