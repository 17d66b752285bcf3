"""scaled_dot_product_attention as CUDA runs it (amem_alloc/predict/rules/sdpa_select.py and
attention.py): the backend sdp_utils.cpp picks for a card and inputs, and what each backend's
kernels allocate, save and free, checked against byte counts worked out from the CUDA sources
(flash_api.cpp, attention.cu, attention_backward.cu, MHA.cpp, attention.cpp)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from amem_alloc.predict.rules.platform import Platform  # noqa: E402
from amem_alloc.predict.rules.sdpa_select import Params, select  # noqa: E402
from amem_alloc.predict.engine.session import FakeCudaSession  # noqa: E402
from amem_alloc.replay import ALLOC  # noqa: E402

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
# (capability, cuDNN, CUDA build, torch release)
H100 = Platform((9, 0), 132, 92400, 13000, (2, 14))
H100_OLD_CUDNN = Platform((9, 0), 132, 91000, 13000, (2, 14))
H100_CU128 = Platform((9, 0), 132, 92400, 12080, (2, 14))
B200 = Platform((10, 0), 148, 92400, 13000, (2, 14))
A100 = Platform((8, 0), 108, 92400, 13000, (2, 14))
A100_TORCH211 = Platform((8, 0), 108, 92400, 12080, (2, 11))
A10G = Platform((8, 6), 80, 92400, 13000, (2, 14))
L40S = Platform((8, 9), 142, 92400, 13000, (2, 14))
V100 = Platform((7, 0), 80, 92400, 13000, (2, 14))


def qkv(dtype=BF16, b=2, hq=8, hk=None, lq=128, lk=None, d=64, grad=False):
    hk, lk = hk or hq, lk or lq
    q = torch.empty(b, hq, lq, d, dtype=dtype, device="meta", requires_grad=grad)
    k = torch.empty(b, hk, lk, d, dtype=dtype, device="meta", requires_grad=grad)
    v = torch.empty(b, hk, lk, d, dtype=dtype, device="meta", requires_grad=grad)
    return q, k, v


def pick(plat, dtype=BF16, mask=None, dropout=0.0, causal=False, gqa=False, grad=False, **shape):
    q, k, v = qkv(dtype, grad=grad, **shape)
    return select(Params(q, k, v, mask, dropout, causal, gqa, True), plat)


MASK2D = torch.empty(128, 128, device="meta")
MASK3D = torch.empty(2, 128, 128, device="meta")


# ============================================================================ the choice
@pytest.mark.parametrize("plat, kwargs, backend", [
    # priority: cuDNN first on sm90/sm100 with cuDNN > 9.15 (check_prefer_cudnn_attention)
    (H100, {}, "cudnn"),
    (B200, {}, "cudnn"),
    (H100_OLD_CUDNN, {}, "flash"),                 # cuDNN 9.10: default order, flash first
    (H100_CU128, {}, "cudnn"),                      # a CUDA 12 build: sm90 minor 0 still preferred
    (A100, {}, "flash"),
    (L40S, {}, "flash"),
    # dtypes: flash/cuDNN take fp16/bf16 (fp16 only below sm80); memory-efficient takes fp32 too
    (A100, dict(dtype=FP32), "efficient"),
    (H100, dict(dtype=FP32), "efficient"),
    (V100, dict(dtype=FP16), "efficient"),          # flash needs sm80
    (V100, dict(dtype=BF16), "math"),               # no bfloat16 kernel below sm80
    (V100, dict(dtype=FP16, d=60), "math"),         # memory-efficient: head dim a multiple of 8 (half)
    (V100, dict(dtype=FP32, d=62), "efficient"),    # fp32 on sm70 has no tensor cores: alignment 1
    (A100, dict(dtype=FP32, d=62), "math"),         # sm80 fp32: alignment 4
    # head dims: flash pads to 8 up to 256; cuDNN needs a multiple of 8, up to 256 on sm90 (128 on sm80)
    (A100, dict(d=100), "flash"),
    (H100, dict(d=100), "flash"),                   # cuDNN rejects 100 (not a multiple of 8)
    (H100, dict(d=256), "cudnn"),
    (A100, dict(d=300), "math"),                    # flash: <= 256; efficient: 300 % 8 != 0
    (A10G, dict(d=200, grad=True), "efficient"),    # flash backward on sm86: no head dim in (192, 224]
    (A10G, dict(d=200), "flash"),                   # ... needed only when a gradient is
    # masks: flash takes none; cuDNN only 2-D or 4-D broadcastable masks; memory-efficient any
    (A100, dict(mask=MASK2D), "efficient"),
    (H100, dict(mask=MASK2D), "cudnn"),
    (H100, dict(mask=MASK3D), "efficient"),
    # dropout: cuDNN only at multiples of 1/16
    (H100, dict(dropout=0.1), "flash"),
    (H100, dict(dropout=0.125), "cudnn"),
    # causal with different query and key lengths: not flash
    (A100, dict(causal=True, lq=64, lk=128), "efficient"),
    (A100, dict(causal=True), "flash"),
    # GQA: 16 query heads over 4 KV heads
    (A100, dict(hq=16, hk=4, gqa=True), "flash"),
    (H100, dict(hq=16, hk=4, gqa=True), "cudnn"),
    (A100, dict(hq=16, hk=4), "math"),               # without enable_gqa every fused kernel refuses
    (A100, dict(hq=16, hk=1), "flash"),              # one KV head: implicit MQA (torch 2.13+)
    (A100_TORCH211, dict(hq=16, hk=1), "math"),      # ... not in torch 2.11
    (A100, dict(dtype=FP32, hq=16, hk=4, gqa=True), "efficient"),   # memory-efficient GQA (2.13+)
    (A100_TORCH211, dict(dtype=FP32, hq=16, hk=4, gqa=True), "math"),
])
def test_backend_choice_follows_sdp_utils(plat, kwargs, backend):
    assert pick(plat, **kwargs) == backend


def test_enabled_backends_and_determinism_are_read_from_torch():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        assert pick(A100) == "efficient"
    with sdpa_kernel([SDPBackend.MATH]):
        assert pick(H100) == "math"
    torch.use_deterministic_algorithms(True)
    try:
        assert pick(H100) == "flash"   # cuDNN attention is not deterministic
    finally:
        torch.use_deterministic_algorithms(False)


# ============================================================================ what each kernel allocates
B, H, L, D = 2, 8, 96, 64


def run(plat_name, capability, fn):
    """Allocations (op, bytes, key) made by fn() under a fake session, and the keys freed."""
    with FakeCudaSession(capability=capability, device_name=plat_name) as s:
        s.marker("start")
        fn()
    start = next(i for i, n in s.markers if n == "start")
    allocs = [(s.infos[k].op, size, k) for kind, k, size, _ in s.ops[start:] if kind == ALLOC]
    freed = {k for kind, k, _, _ in s.ops if kind != ALLOC}
    return allocs, freed, s


def sizes(allocs, op):
    return sorted(size for name, size, _ in allocs if name == op)


A100_NAME, H100_NAME = "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"


def _train(dtype=BF16, hq=H, hk=H, gqa=False, lq=L, lk=L, d=D, mask=None, dropout=0.0, keep=None):
    q = torch.randn(B, hq, lq, d, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(B, hk, lk, d, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(B, hk, lk, d, device="cuda", dtype=dtype, requires_grad=True)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, enable_gqa=gqa)
    if keep is not None:
        keep.append(out)
    out.backward(torch.ones_like(out))


def test_flash_saves_out_logsumexp_and_rng_state_and_its_backward_takes_softmax_d_and_dq_accum():
    allocs, freed, _ = run(A100_NAME, (8, 0), _train)
    assert sizes(allocs, "_scaled_dot_product_flash_attention.default") == sorted(
        [B * L * H * D * 2, B * H * L * 4, 16, 8])        # out, logsumexp f32, rng_state u64[2], unused u64
    l128 = 128                                             # round_up(96, 128)
    temporaries = {name.split(":")[1]: (size, key) for name, size, key in allocs
                   if name.startswith("_scaled_dot_product_flash_attention_backward:")}
    assert temporaries["softmax_d"][0] == B * H * l128 * 4
    assert temporaries["dq_accum"][0] == B * l128 * H * 64 * 4      # head dim 64 rounded to 32: 64
    assert "dk_expanded" not in temporaries
    assert all(key in freed for _, key in temporaries.values())     # all die with the kernel


def test_flash_gqa_runs_on_the_small_kv_and_sums_expanded_gradients():
    hq, hk = 16, 4
    allocs, freed, _ = run(A100_NAME, (8, 0), lambda: _train(hq=hq, hk=hk, gqa=True))
    assert not any(name in ("clone.default", "repeat_interleave.self_int") for name, _, _ in allocs)
    temporaries = dict((name.split(":")[1], size) for name, size, _ in allocs
                       if name.startswith("_scaled_dot_product_flash_attention_backward:"))
    assert temporaries["dk_expanded"] == temporaries["dv_expanded"] == B * L * hq * D * 2
    grads = sizes(allocs, "_scaled_dot_product_flash_attention_backward.default")
    assert grads == sorted([B * hq * L * D * 2, B * hk * L * D * 2, B * hk * L * D * 2])


def test_llama_like_gqa_is_far_smaller_on_flash_than_the_math_path_would_be():
    """The bug report: 16 query heads over 4 KV heads used to go to math, which repeats K and V and
    keeps the float32 attention weights; flash keeps only the output and the log-sum-exp."""
    hq, hk, seq = 16, 4, 512

    def step():
        _train(hq=hq, hk=hk, gqa=True, lq=seq, lk=seq)

    flash, _, _ = run(A100_NAME, (8, 0), step)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.MATH]):
        math_allocs, _, _ = run(A100_NAME, (8, 0), step)
    weights = B * hq * seq * seq * 4
    assert max(size for _, size, _ in flash) < weights
    assert sum(1 for _, size, _ in math_allocs if size == weights) >= 3   # scores, softmax, its saved result
    assert len(sizes(math_allocs, "clone.default")) == 2                  # repeat_interleave of K and V


def test_efficient_pads_logsumexp_to_32_and_keeps_its_philox_seed_on_the_host():
    lq = 100
    allocs, _, _ = run(A100_NAME, (8, 0), lambda: _train(dtype=FP32, lq=lq, lk=lq))
    assert sizes(allocs, "_scaled_dot_product_efficient_attention.default") == sorted(
        [B * lq * H * D * 4, B * H * 128 * 4])              # out, logsumexp [B, H, ceil32(100)]; no seed/offset
    delta = [size for name, size, _ in allocs if name.endswith(":delta")]
    assert delta == [B * H * lq * 4]


def test_efficient_with_a_bool_mask_converts_it_as_attention_cpp_does():
    mask = lambda: torch.ones(L, L, dtype=torch.bool, device="cuda").tril()
    allocs, _, _ = run(A100_NAME, (8, 0), lambda: _train(dtype=FP16, mask=mask()))
    assert sizes(allocs, "logical_not.default") == [L * L]
    assert sizes(allocs, "where.self") == [L * L * 2]     # the additive fp16 mask (-inf where False)
    assert not any(name == "constant_pad_nd.default" for name, _, _ in allocs)   # 96 = 12 * 8: aligned


def test_cudnn_saves_stats_and_its_backward_takes_the_frontend_workspace():
    hq, hk = 16, 4
    allocs, freed, s = run(H100_NAME, (9, 0), lambda: _train(hq=hq, hk=hk, gqa=True))
    assert sizes(allocs, "_scaled_dot_product_cudnn_attention.default") == sorted(
        [B * hq * L * D * 2, B * hq * L * 4, 8, 8])         # out, softmax stats [B, H, L, 1] f32, seed, offset
    (workspace,) = [(size, key) for name, size, key in allocs if name.endswith("backward workspace")]
    softmax_sum, dq_accum = B * hq * L * 4, B * hq * L * D * 4
    full_head_dk = full_head_dv = B * hq * L * D * 2
    assert workspace[0] == softmax_sum + dq_accum + full_head_dk + full_head_dv
    assert workspace[1] in freed
    assert any("cuDNN attention backward workspace" in n.what for n in s.notes)


def test_cudnn_inference_allocates_no_softmax_stats():
    def infer():
        with torch.no_grad():
            q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=BF16) for _ in range(3))
            F.scaled_dot_product_attention(q, k, v)
    allocs, _, _ = run(H100_NAME, (9, 0), infer)
    assert sizes(allocs, "_scaled_dot_product_cudnn_attention.default") == sorted([B * H * L * D * 2, 8, 8])


def test_flash_decoding_takes_split_kv_accumulators():
    """One query against 4096 keys: num_splits_heuristic splits the keys. A100: 108 SMs, so 216
    'SMs' for 128-thread blocks; B*H*ceil(1/64) = 8 blocks; head dim 64 -> 256-key blocks, 16 of
    them; efficiency 8n/216 peaks at n = 16, the only eligible count above 0.85 of it -> 16 splits."""
    def decode():
        with torch.no_grad():
            q = torch.randn(1, 8, 1, 64, device="cuda", dtype=BF16)
            k, v = (torch.randn(1, 8, 4096, 64, device="cuda", dtype=BF16) for _ in range(2))
            F.scaled_dot_product_attention(q, k, v)
    allocs, freed, _ = run(A100_NAME, (8, 0), decode)
    accum = {name.split(":")[1]: (size, key) for name, size, key in allocs if ":" in name}
    assert accum["softmax_lse_accum"][0] == 16 * 1 * 8 * 1 * 4
    assert accum["out_accum"][0] == 16 * 1 * 8 * 1 * 64 * 4
    assert all(key in freed for _, key in accum.values())


def test_math_path_adds_the_mask_in_place_and_keeps_the_fused_dropout_bool_mask():
    mask = lambda: torch.zeros(L, L, device="cuda", dtype=BF16)
    allocs, _, _ = run("Tesla V100-SXM2-16GB", (7, 0),
                       lambda: _train(dtype=BF16, mask=mask(), dropout=0.1))   # bf16 on sm70: math
    weights = B * H * L * L
    assert not any(name == "add.Tensor" and size == weights * 4 for name, size, _ in allocs)
    assert sizes(allocs, "native_dropout.default") == sorted([weights * 4, weights])   # output, bool mask
    assert sizes(allocs, "_safe_softmax:masked") == [weights]
