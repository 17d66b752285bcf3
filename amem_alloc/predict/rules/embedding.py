"""Embedding's backward on CUDA: the sort and segment buffers it takes beside grad_weight.

Design note
-----------
`embedding_dense_backward` (aten/src/ATen/native/cuda/Embedding.cu) returns only grad_weight
[num_weights, D], which the meta kernel shows. Inside, in order:

* `indices.contiguous()` and `grad.contiguous()` when they are not;
* with at most 3072 indices and no scale_grad_by_freq: nothing else (one kernel over the rows);
* otherwise `sorted_indices` and `orig_indices` (each like the indices), `range =
  arange(num_indices)` and cub's radix-sort temporary storage (cuda/cub.cu `radix_sort_pairs` via
  CUB_WRAPPER, through the caching allocator), both freed after the sort; with scale_grad_by_freq
  `count` (like the indices) and the temporary storage of two cub scans by key;
* then `embedding_backward_cuda_kernel` (EmbeddingBackwardKernel.cu): grad_weight (the output),
  `segment_offsets` [n], `num_of_segments` (an int64 scalar), cub unique-by-key storage,
  `partials_per_segment` and `partials_per_segment_offset` [n], cub exclusive-sum storage,
  `num_of_partial_segments` (int64), `partial_segment_offset` [n], and `grad_weight_per_segment`
  [n, D] in float32 for float16/bfloat16 gradients (the accumulation type), else the gradient's
  dtype; all freed when the op returns.

cub's temporary storage sizes are cub's own and are estimated (notes): a radix sort that may not
overwrite its input keeps alternate key and value buffers of n elements each plus its digit
histograms (8 bits a pass, 256 four-byte counters per pass and per 4096 elements); a scan or a
unique keeps one 16-byte tile descriptor per 1920 elements plus 32 of padding.
"""
from __future__ import annotations

import torch

from .registry import Stage, aten_op, rule
from .scratch import Scratch, ceil_div, nbytes

_HALF = (torch.float16, torch.bfloat16)
_WHY = "cub's own temporary storage, estimated"


@rule(Stage.KERNEL, aten_op("embedding_dense_backward"), source="aten/src/ATen/native/cuda/Embedding.cu")
def dense_backward(args, kwargs, s: Scratch, session) -> None:
    grad, indices = args[0], args[1]
    scale = bool(args[4]) if len(args) > 4 else bool(kwargs.get("scale_grad_by_freq", False))
    n, width, index_size = indices.numel(), grad.shape[-1], indices.element_size()
    if not indices.is_contiguous():
        s.take(nbytes(indices.shape, indices.dtype), "indices.contiguous")
    if not grad.is_contiguous():
        s.take(nbytes(grad.shape, grad.dtype), "grad.contiguous")
    if n <= 3072 and not scale:
        return
    s.take(n * index_size, "sorted_indices")
    s.take(n * index_size, "orig_indices")
    arange = s.take(n * index_size, "range")
    sort = s.estimate(radix_sort_bytes(n, index_size, index_size), "cub radix sort storage (embedding backward)", _WHY)
    s.give(sort)
    s.give(arange)
    if scale:
        s.take(n * index_size, "count")
        for _ in range(2):   # inclusive_sum_by_key, then inclusive_scan_by_key
            s.give(s.estimate(scan_bytes(n), "cub scan storage (embedding backward)", _WHY))
    _segments(n, width, index_size, grad.dtype, s)


def _segments(n: int, width: int, index_size: int, dtype, s: Scratch) -> None:
    """embedding_backward_cuda_kernel's buffers, after grad_weight."""
    s.take(n * index_size, "segment_offsets")
    s.take(8, "num_of_segments")
    s.give(s.estimate(scan_bytes(n), "cub scan storage (embedding backward)", _WHY))   # unique_by_key
    s.take(n * index_size, "partials_per_segment")
    s.take(n * index_size, "partials_per_segment_offset")
    s.give(s.estimate(scan_bytes(n), "cub scan storage (embedding backward)", _WHY))   # exclusive_sum
    s.take(8, "num_of_partial_segments")
    s.take(n * index_size, "partial_segment_offset")
    accumulate = torch.float32 if dtype in _HALF else dtype
    s.take(nbytes((n, width), accumulate), "grad_weight_per_segment")


def radix_sort_bytes(n: int, key_size: int, value_size: int) -> int:
    passes = ceil_div(key_size * 8, 8)
    return n * (key_size + value_size) + passes * 256 * 4 * (1 + ceil_div(n, 4096))


def scan_bytes(n: int) -> int:
    return (ceil_div(n, 1920) + 32) * 16
