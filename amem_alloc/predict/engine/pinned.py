"""Host memory a program pinned: with no CUDA driver, `Tensor.pin_memory()` and a factory's
`pin_memory=True` make ordinary host memory (torch_patches.py, device_mode.py), and
`Tensor.is_pinned()` answers from here, as torch would: true for what was pinned and its views.

Each pinned storage is known by its address while it lives: torch keeps one Python object per
storage while any tensor holds it (storages.py), so a weak reference to it ends the entry when the
storage dies, and a later storage at the same address is not taken for it.
"""
from __future__ import annotations

import weakref

import torch


class PinnedHost:
    """The storages pinned in a session, by address."""

    def __init__(self) -> None:
        self._by_address: dict[int, weakref.ref] = {}

    def add(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        address = storage.data_ptr()
        by_address = self._by_address
        def forget(ref: weakref.ref) -> None:   # (a later storage at the address has its own entry)
            if by_address.get(address) is ref:
                del by_address[address]
        by_address[address] = weakref.ref(storage, forget)

    def holds(self, t: torch.Tensor) -> bool:
        """Whether `t`'s storage is one pinned here."""
        try:
            storage = t.untyped_storage()
        except (NotImplementedError, RuntimeError):   # a tensor without storage of its own
            return False
        ref = self._by_address.get(storage.data_ptr())
        return ref is not None and ref() is storage
