"""`Tensor.share_memory_()` and `is_shared()` on CUDA: nothing to do, and always shared.

Design note
-----------
torch moves a CPU tensor's storage into shared memory for other processes (Hogwild training,
`model.share_memory()` before `torch.multiprocessing` workers), and for a CUDA tensor the call does
nothing: CUDA memory is shared through IPC handles when the tensor is sent (torch/storage.py,
`share_memory_`: "a no-op for CUDA"). A fake CUDA tensor is a meta tensor, which torch sends down
the CPU path, where it raised ("_share_fd_: only available on CPU") and stopped the script. So a
fake CUDA tensor's call returns the tensor, as CUDA's does, and `is_shared()` says True, as torch
says for every CUDA tensor; a real host tensor's calls are torch's own.
"""
from __future__ import annotations

from .registry import Stage, rule


def _fake_cuda(args, mode) -> bool:
    return bool(args) and mode.storages.device_of(args[0]) == "cuda"


@rule(Stage.FUNCTION, "share_memory_", source="torch/storage.py (share_memory_: a no-op for CUDA)")
def share_memory(func, args, kwargs, mode):
    return args[0] if _fake_cuda(args, mode) else None


@rule(Stage.FUNCTION, "is_shared", source="torch/_tensor.py (is_shared: always True for CUDA tensors)")
def is_shared(func, args, kwargs, mode):
    return True if _fake_cuda(args, mode) else None
