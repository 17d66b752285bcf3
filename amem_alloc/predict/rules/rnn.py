"""Recurrent layers (nn.LSTM, nn.GRU, nn.RNN) on CUDA: cuDNN's flat weight buffer, and a note for
the cuDNN kernel itself.

Design note
-----------
Moving an RNN module to CUDA calls `flatten_parameters`, which asks cuDNN to pack every weight into
one buffer (aten/src/ATen/native/cudnn/RNN.cpp `_cudnn_rnn_flatten_weight`: `at::zeros(num_weights)`,
the weights copied in, each parameter then `set_` to its view of the buffer, so the separate
storages die). On a fake tensor torch's call reaches cuDNN and stops; `flatten_weight` does the
same with ops the modes record: the buffer (one element per weight element: cuDNN's weight space
for the standard layouts, no padding), the copies, the views.

The forward and backward are cuDNN's RNN kernel on the GPU, with a reserve buffer (what backward
needs, sized by cudnnGetRNNTempSpaceSizes) and a workspace, which no source gives without a GPU.
On a fake tensor torch runs its own per-step implementation (matmuls and cells, their outputs
saved for backward) instead; `note_kernel` says so wherever an RNN runs, and the figures are those
of torch's implementation.

A packed sequence (`pack_padded_sequence`) keeps its lengths and batch sizes on the host, where
CUDA's kernels read them (aten/src/ATen/native/PackedSequence.cpp, RNN.cpp): the ops taking them
keep them there (a HOST_INPUTS rule), where a host tensor given to a CUDA op is otherwise moved
onto the fake device.
"""
from __future__ import annotations

import torch

from .. import notes
from .registry import Stage, aten_op, rule

KERNEL_NOTE = ("{name} on CUDA: cuDNN's RNN kernel (its reserve buffer for backward and its workspace) is not "
               "modelled; torch's own per-step implementation's allocations stand in for it")


@rule(Stage.FUNCTION, "_cudnn_rnn_flatten_weight", source="aten/src/ATen/native/cudnn/RNN.cpp (_cudnn_rnn_flatten_weight)")
def flatten_weight(func, args, kwargs, mode):
    """cuDNN's packing of an RNN's weights into one buffer, each weight then a view of it."""
    weights = list(args[0] if args else kwargs["weight_arr"])
    if not weights or any(mode.storages.device_of(w) != "cuda" for w in weights):
        return None
    flat = torch.zeros(sum(w.numel() for w in weights), dtype=weights[0].dtype, device=weights[0].device)
    offset = 0
    with torch.no_grad():
        for w in weights:
            view = flat[offset:offset + w.numel()].view(w.shape)
            view.copy_(w)
            w.set_(view)
            offset += w.numel()
    return flat


@rule(Stage.FUNCTION, "lstm", "gru", "rnn_tanh", "rnn_relu", source="aten/src/ATen/native/RNN.cpp (use_cudnn)")
def note_kernel(func, args, kwargs, mode):
    """An RNN run on fake CUDA tensors: noted (torch's own implementation runs; see above)."""
    data = args[0] if args else None
    if isinstance(data, torch.Tensor) and mode.storages.device_of(data) == "cuda":
        notes.record(notes.NOT_MODELLED, KERNEL_NOTE.format(name=func.__name__.upper().replace("_", " ")))
    return None


@rule(Stage.HOST_INPUTS, aten_op("_pack_padded_sequence"), aten_op("_pack_padded_sequence_backward"),
      aten_op("_pad_packed_sequence"), aten_op("lstm.data"), aten_op("gru.data"), aten_op("rnn_tanh.data"),
      aten_op("rnn_relu.data"), source="aten/src/ATen/native/PackedSequence.cpp (lengths, batch_sizes: CPU)")
def packed_sequence_sizes(args, kwargs) -> bool:
    """A packed sequence's lengths and batch sizes stay host tensors (see the note)."""
    return True
