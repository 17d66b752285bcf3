"""Workloads: real torch models for `amem compare`, and a synthetic allocation pattern for `amem demo`.

Each bundled workload is run(size=1, steps=None, device="cpu", seed=0, on_step=None) -> dict:
a real model that calls on_step(i) after each step; all but llama7b are small enough for a CPU at
size 1 (llama7b is 7e9 parameters: for `amem predict`, which runs nothing). Workloads with more
than one stream use workloads/streams.py, which works on CUDA and on the CPU.
training_events() is the synthetic pattern (no torch) that `amem demo` allocates.

Sizes and steps are bounded (MAX_SIZE, MAX_STEPS) wherever a workload is run: a size of 10^20
once reached torch as a C++ overflow with 39 lines of frames, and 10^9 steps never end.
"""
import functools

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


MAX_SIZE = 4096      # the size knob: batch (llama7b) or a scale of the model; larger ones overflow torch's shapes
MAX_STEPS = 100_000  # steps of one run


def check_size(size: object, steps: object = None) -> None:
    """ValueError (one line, what to give) for a size or step count no workload can run."""
    for option, value, most in (("--size", size, MAX_SIZE), ("--steps", steps, MAX_STEPS)):
        if value is None and option == "--steps":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise ValueError(f"{option} {value}: a workload takes an integer from 1 to {most:,}")


def get(name: str):
    """The run function of a bundled workload (its size and steps checked first); ValueError
    naming the choices."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")
    run = WORKLOADS[name][0]

    @functools.wraps(run)
    def checked(size: int = 1, steps: int | None = None, *args, **kwargs):
        check_size(size, steps)
        return run(size, steps, *args, **kwargs)

    return checked


__all__ = ["MAX_SIZE", "MAX_STEPS", "WORKLOADS", "check_size", "get", "training_events"]
