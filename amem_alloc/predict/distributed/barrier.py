"""dist.barrier under prediction: the one-byte device tensor torch's C++ makes for it, without the
driver.

Design note
-----------
c10d's barrier (torch/csrc/distributed/c10d/ProcessGroup.hpp, `ProcessGroup::barrier`) allocates
`static at::Tensor tensor = at::empty({1}, device)` in C++ on the device the Python wrapper chose
(distributed_c10d.py `barrier`: `device_ids[0]`, the group's bound device, or the current
accelerator) — or on CUDA for any NCCL group — and keeps it in a static, replaced at the next
barrier. Made in C++, that allocation reaches the real CUDA driver ("Found no NVIDIA driver").
Here the wrapper runs with no device (torch's fake process group barriers on the CPU), and the
byte a GPU would hold is recorded instead: one storage of 1 byte, the new one allocated before the
previous one is freed, as the static's assignment does.

A monitored barrier (`dist.monitored_barrier`, a group's `monitored_barrier`: gloo's, which
Lightning's `_InfiniteBarrier` uses around `rank_zero_first`) is CPU-only in torch and holds no
device memory; torch's fake process group refuses it ("only GLOO supports monitored barrier").
Here it returns at once, as it does where every rank arrives.
"""
from __future__ import annotations

from typing import Any

from ...patching import PatchSet, declare
from .. import state

BARRIER = declare("torch.distributed, torch.distributed.distributed_c10d", "barrier",
                  "the 1-byte device tensor c10d's C++ barrier makes is recorded, not made (no driver)")
MONITORED = declare("torch.distributed.ProcessGroup", "monitored_barrier",
                    "returns at once: gloo's monitored barrier holds no device memory, and the fake process group "
                    "refuses it")
_STATIC = "c10d barrier"   # the op name each such byte is recorded under


class _StaticByte:
    """The barrier's static device tensor, per rank: its key while it lives."""

    def __init__(self) -> None:
        self.key: int | None = None

    def replace(self) -> None:
        st = state.current()
        if st is None or st.session is None:
            return
        storages = st.session.storages
        new = storages.alloc_extra(1, _STATIC)
        if self.key is not None:
            storages.on_free(self.key)
        self.key = new


def install(patches: PatchSet, modules: tuple, on_device: Any) -> None:
    """Replaces barrier in `modules` (dist and c10d); on_device(device_ids) says whether a GPU run
    would have made its byte on the GPU (an NCCL group, device_ids, a bound device)."""
    original = modules[-1].barrier
    byte = _StaticByte()

    def barrier(group: Any = None, async_op: bool = False, device_ids: Any = None, timeout: Any = None) -> Any:
        if on_device(device_ids):
            byte.replace()
        return original(group, async_op=async_op, device_ids=None, timeout=timeout)

    for module in modules:
        patches.apply(BARRIER, module, "barrier", barrier)
    patches.apply(MONITORED, modules[0].ProcessGroup, "monitored_barrier", _monitored_barrier)


def _monitored_barrier(group: Any, timeout: Any = None, wait_all_ranks: bool = False) -> None:
    return None
