"""FlexAttention and RMS norm as CUDA runs them (amem_alloc/predict/rules/flex_attention.py, norms.py).

Byte counts are worked out here from the shapes and torch's sources: inductor's flex_attention
lowerings (torch/_inductor/kernel/flex/flex_attention.py), the dense implementation
(torch/_higher_order_ops/flex_attention.py `math_attention`), `_fused_rms_norm`
(aten/src/ATen/native/cuda/layer_norm_kernel.cu); and one program is held to its real run on an
H200 (benchmarks/gpu_runs/h200-2026-11-27)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
flex_mod = pytest.importorskip("torch.nn.attention.flex_attention")

from amem_alloc.predict.engine.session import FakeCudaSession  # noqa: E402
from test_predict_kernels import allocs, events, peak_extra  # noqa: E402

H100 = dict(capability=(9, 0), device_name="NVIDIA H100 80GB HBM3")
ROOT = Path(__file__).resolve().parent.parent
B, HQ, HKV, L, D = 2, 8, 2, 256, 64
BF16 = 2


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _attention(compiled: bool, gqa: bool = True):
    """q [B, HQ, L, D], k and v [B, HKV, L, D] bf16 leaves; markers around forward and backward."""
    s = FakeCudaSession(**H100)
    with s:
        hkv = HKV if gqa else HQ
        q = torch.randn(B, HQ, L, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(B, hkv, L, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in "kv")
        s.marker("mask")
        mask = flex_mod.create_block_mask(causal, B=None, H=None, Q_LEN=L, KV_LEN=L, device="cuda")
        fn = torch.compile(flex_mod.flex_attention) if compiled else flex_mod.flex_attention
        s.marker("forward")
        out = fn(q, k, v, block_mask=mask, enable_gqa=gqa)
        grad = torch.randn_like(out)
        s.marker("backward")
        out.backward(grad)
        s.marker("end")
        assert out.is_cuda and q.grad.shape == q.shape and k.grad.shape == k.shape
    return s


def test_compiled_flex_forward_allocates_output_logsumexp_and_maxima_only():
    s = _attention(compiled=True)
    stats = B * HQ * L * 4                       # logsumexp and row maxima, float32
    assert allocs(s, "forward", "backward")[:3] == [("new_empty.default", stats), ("new_empty.default", stats),
                                                    ("new_empty_strided.default", B * HQ * L * D * BF16)]
    kinds = [e[0] for e in events(s, "forward", "backward")]
    assert kinds[:4] == ["alloc", "alloc", "alloc", "free"]   # the maxima die with the compiled call
    assert max(size for _, size in allocs(s, "forward", "backward")) < B * HQ * L * L   # no scores matrix


def test_compiled_flex_backward_allocates_delta_and_the_three_gradients_with_kv_heads():
    s = _attention(compiled=True)
    sizes = sorted(size for _, size in allocs(s, "backward", "end"))
    q_bytes, kv_bytes = B * HQ * L * D * BF16, B * HKV * L * D * BF16
    assert sizes == sorted([B * HQ * L * 4, q_bytes, kv_bytes, kv_bytes])   # delta, dq, dk, dv
    assert peak_extra(s, "backward", "end") == B * HQ * L * 4 + q_bytes + 2 * kv_bytes


def test_uncompiled_flex_materialises_the_float32_scores_as_the_dense_path_does():
    s = _attention(compiled=False, gqa=False)
    scores = B * HQ * L * L * 4
    forward = [size for _, size in allocs(s, "forward", "backward")]
    assert forward.count(scores) >= 2            # the scores and their softmax (math_attention)
    assert max(size for _, size in allocs(s, "backward", "end")) >= scores


def test_create_block_mask_runs_its_vmapped_mask_and_keeps_only_block_indices():
    s = _attention(compiled=True)
    made = allocs(s, "mask", "forward")
    assert any(size == L * L for _, size in made)   # the [L, L] bool mask, as the uncompiled call makes it
    marks = dict((name, i) for i, name in s.markers)
    live = {key for kind, key, size, _ in s.ops[marks["mask"]:marks["forward"]] if kind == 0}
    freed = {key for kind, key, size, _ in s.ops[marks["mask"]:marks["forward"]] if kind == 1}
    kept = sum(s.infos[k].requested for k in live - freed)
    assert 0 < kept < 4096                        # block counts and indices: a few int32s per block


def test_rms_norm_is_the_fused_kernel_saving_its_input_not_the_normalised_copy():
    s = FakeCudaSession(**H100)
    with s:
        norm = torch.nn.RMSNorm(1024).cuda()
        x = torch.randn(8, 512, 1024, device="cuda", requires_grad=True)
        s.marker("forward")
        y = norm(x)
        s.marker("backward")
        y.backward(torch.randn_like(y))
        s.marker("end")
    act = 8 * 512 * 1024 * 4
    assert allocs(s, "forward", "backward") == [("empty_like.default", act), ("new_empty.default", 8 * 512 * 4)]
    assert [size for _, size in allocs(s, "backward", "end")][-2:] == [act, 1024 * 4]   # dx, dweight


def test_rms_norm_with_a_weight_of_another_dtype_takes_torchs_composite():
    s = FakeCudaSession(**H100)
    with s:
        norm = torch.nn.RMSNorm(64).cuda()
        x = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
        s.marker("forward")
        norm(x)
        s.marker("end")
    assert "empty_like.default" not in [op for op, _ in allocs(s, "forward", "end")]


def test_flex_decoder_peak_equals_its_real_h200_run():
    """tests/programs/flex_attention_decoder.py as run on an H200 (torch 2.11): compiled flex
    attention, RMS norms, bf16 autocast, AdamW. The real peak allocated was 3,190,246,912 bytes."""
    run = ROOT / "benchmarks" / "gpu_runs" / "h200-2026-11-27" / "predict_vs_real.json"
    real = json.loads(run.read_text())["real"]["flex_attention_decoder"]
    s = FakeCudaSession(capability=(9, 0), device_name="NVIDIA H200")
    argv = sys.argv
    try:
        sys.argv = ["flex_attention_decoder.py", *real["args"]]
        with s:
            import runpy
            runpy.run_path(str(ROOT / "tests" / "programs" / "flex_attention_decoder.py"), run_name="__main__")
    finally:
        sys.argv = argv
    live = peak = 0
    sizes = {}
    for kind, key, size, _ in s.ops:
        if kind == 0:
            sizes[key] = size
            live += size
            peak = max(peak, live)
        elif key in sizes:
            live -= sizes.pop(key)
    assert abs(peak - real["peak_allocated"]) / real["peak_allocated"] < 0.001


def test_compiling_flex_attention_alone_is_modelled_and_not_noted_as_eager():
    """torch.compile(flex_attention) is the fused kernel's rule, not compiled code run as eager;
    compiling anything else is traced as compiled, and said so."""
    assert not [n for n in _attention(compiled=True).notes if n.what.startswith("torch.compile")]
    s = FakeCudaSession(**H100)
    with s:
        torch.compile(torch.nn.functional.gelu)(torch.randn(4, device="cuda"))
    assert [n.kind for n in s.notes if n.what.startswith("torch.compile")] == ["compiled"]
