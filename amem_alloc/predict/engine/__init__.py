"""Fake execution: real CPU, fake CUDA. CPU work runs for real; CUDA tensors are meta tensors that
say "cuda"; torch's own autograd engine runs; every CUDA storage's life is recorded.

Design note
-----------
Everything that lives on the CPU is real: datasets, numpy, tokenizers, `torch.randint` and
`randperm`, samplers, DataLoader workers, collate functions, bookkeeping. An op whose inputs are
all real runs for real and records nothing (the process's own memory is never counted as GPU
memory). Only CUDA storages are fake: *meta* tensors with shape, dtype, strides and a storage of
a known size, but no data and no memory. Meta tensors go through torch's real dispatcher and its
real autograd engine (the C++ one: a fake CUDA device cannot, because the engine asks the CUDA
driver about streams and contexts), so every lifetime is torch's own: saved tensors and their
release after each node runs, gradient accumulation and stealing, views sharing a storage,
in-place ops, `del`, optimizer state, checkpointing.

A real CPU tensor that crosses to the device (`.to("cuda")`, `.cuda()`, a module's `.cuda()` with
its buffers) becomes a fake CUDA tensor of the same shape, dtype and strides, and the copy's
allocation is recorded. A fake tensor brought back (`loss.cpu()`) is a fake CPU tensor: it holds
no value either. Parameters are always fake (session.py): their values never decide what CUDA
allocates, and a 7B model built on the CPU would need 28 GB of RAM.

Which meta tensors are "CUDA" is kept beside them, per storage (`Storages`, storages.py). A
torch-function mode (`DeviceMode`) rewrites CUDA devices to meta on the way in and answers
`tensor.device`, `is_cuda`, `get_device()` as the user's code expects; it applies CUDA's autocast policy (meta tensors have
no autocast kernels: see autocast.py) and answers reads of a fake tensor's value with a stand-in
(values.py). A torch-dispatch mode (`Recorder`, recorder.py), below autograd, sees every aten op: each new
storage of an op on fake tensors is an allocation (its nominal bytes: the allocator rounds), and
a weak reference to the storage reports the free when torch drops the last reference. CUDA-only
allocations (workspaces, kernel temporaries, attention backends) come from the rules (rules/,
looked up by op and stage in rules/registry.py).

The files: session.py (FakeCudaSession: the modes, the phases, what each storage is),
torch_patches.py (what the session changes in torch while it runs), device_mode.py (and data_setter.py:
`.data =` across the host and the fake device), recorder.py,
devices.py (the per-thread device stacks both modes read), meta_cache.py, storages.py (each
storage's life and device), values.py and known.py (values read and known), autocast.py (CUDA's
autocast policy), stream_uses.py (record_stream and frees held for other streams), children.py
(child processes).
"""
from __future__ import annotations

from .devices import unspoofed
from .values import DataDependentError, is_fake

__all__ = ["DataDependentError", "is_fake", "unspoofed"]
