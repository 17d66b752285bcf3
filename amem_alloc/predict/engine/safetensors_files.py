"""safetensors files written from fake tensors, under prediction.

Design note
-----------
Training scripts save checkpoints with safetensors (diffusers' and transformers' `save_pretrained`,
accelerate's `save_state`). safetensors reads each tensor's bytes from its address: it moves the
tensor to the CPU, then reads `data_ptr()` with ctypes (safetensors/torch.py `_to_ndarray`; older
releases `_tobytes`). A fake tensor has no bytes, and the address it answers (storages.py: programs
key tensors by it) is no memory of this process: reading it crashed the process (a segmentation
fault in diffusers' train_unconditional.py at its `save_pretrained`).

So while a prediction runs, a fake tensor's bytes are zeros of its size: the file is a valid
safetensors file of the right shapes and dtypes, as the program would write it, with zeros where
the values would be (no value is computed under prediction). The zeros come from one buffer shared
by every tensor of a save (its largest tensor's size), so saving a large model costs no more host
memory than its largest tensor. Each save that met a fake tensor is noted once (not once per
tensor: a model's save counted 56 times read as 56 files). A save holding
fake tensors to a file that was there before the prediction goes to a scratch copy instead
(saved_files.py).
"""
from __future__ import annotations

from typing import Any

import torch

from ...patching import PatchSet, declare
from .. import notes
from .values import is_fake

TO_ARRAY = declare("safetensors.torch", "_to_ndarray, _tobytes",
                   "a fake tensor's bytes, which safetensors reads from its address, are zeros of its size (its "
                   "address is no memory of this process)")
WRITE = declare("safetensors.torch", "serialize_file, serialize",
                "a file saved from fake tensors never overwrites one that was there (saved_files.py); each save "
                "that met a fake tensor is noted once")
READ = declare("safetensors.torch", "safe_open", "load_file of a path saved to a scratch copy reads the copy "
               "(saved_files.py)")
NOTE = "safetensors save of fake tensors: their values are zeros (no value is computed under prediction)"
_FAKE_IN_SAVE: list = []   # [True] once a save being flattened met a fake tensor
_ZEROS: list = []   # the shared buffer of zero bytes, as large as the largest tensor saved so far


def _zero_bytes(n: int):
    import numpy as np

    if not _ZEROS or _ZEROS[0].size < n:
        _ZEROS[:] = [np.zeros(max(n, 1), dtype=np.uint8)]
    return _ZEROS[0][:n]


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _as_array(original: Any) -> Any:
    """_to_ndarray(tensor) -> (array over its bytes, what keeps them alive)."""
    def to_ndarray(tensor: torch.Tensor):
        if not is_fake(tensor):
            return original(tensor)
        _met_fake()
        return _zero_bytes(_nbytes(tensor)), tensor
    return to_ndarray


def _as_bytes(original: Any) -> Any:
    """_tobytes(tensor, name) -> bytes (safetensors before _to_ndarray)."""
    def tobytes(tensor: torch.Tensor, name: str) -> bytes:
        if not is_fake(tensor):
            return original(tensor, name)
        _met_fake()
        return bytes(_nbytes(tensor))
    return tobytes


def _met_fake() -> None:
    """A save being flattened met a fake tensor: noted at its first."""
    if not _FAKE_IN_SAVE:
        notes.record(notes.STAND_IN, NOTE)
        _FAKE_IN_SAVE[:] = [True]


def _to_bytes(original: Any) -> Any:
    """serialize(tensors, ...) -> bytes (safetensors.torch.save): the save's end, as serialize_file's."""
    def serialize(*args, **kwargs):
        _FAKE_IN_SAVE[:] = []
        return original(*args, **kwargs)
    return serialize


def _kept_apart(original: Any, saved: Any) -> Any:
    """serialize_file(tensors, filename, ...), after the tensors were flattened: a save that met a
    fake tensor writes where `saved` (saved_files.SavedFiles) says."""
    def serialize_file(tensors, filename, *args, **kwargs):
        met_fake, _FAKE_IN_SAVE[:] = bool(_FAKE_IN_SAVE), []
        return original(tensors, saved.target(filename) if met_fake else filename, *args, **kwargs)
    return serialize_file


def install(patches: PatchSet, saved: Any) -> None:
    """The patches above, where safetensors is installed."""
    try:
        import safetensors.torch as st
    except Exception:   # not installed, or a build this code does not know: nothing to patch
        return
    _FAKE_IN_SAVE[:] = []
    if hasattr(st, "_to_ndarray"):
        patches.apply(TO_ARRAY, st, "_to_ndarray", _as_array(st._to_ndarray))
    if hasattr(st, "_tobytes"):
        patches.apply(TO_ARRAY, st, "_tobytes", _as_bytes(st._tobytes))
    if hasattr(st, "serialize_file"):
        patches.apply(WRITE, st, "serialize_file", _kept_apart(st.serialize_file, saved))
    if hasattr(st, "serialize"):
        patches.apply(WRITE, st, "serialize", _to_bytes(st.serialize))
    if hasattr(st, "safe_open"):
        opener = st.safe_open
        patches.apply(READ, st, "safe_open",
                      lambda filename, *args, **kwargs: opener(saved.source(filename), *args, **kwargs))
