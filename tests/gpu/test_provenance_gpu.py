"""Provenance on a GPU: with amem as torch's allocator the figures are real block sizes, with the
native allocator they are its rounding. Each case runs in a fresh process (amem can be swapped in
only before CUDA starts); expected figures are derived here from element counts and sizes."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import ALLOCATOR_FROM_ARGV, run_python  # noqa: E402

pytestmark = pytest.mark.gpu

PRELUDE = ALLOCATOR_FROM_ARGV + """
import amem_alloc
from amem_alloc import Tracer
"""


def _run(body: str, allocator: str) -> dict:
    proc = run_python(PRELUDE + body, args=[allocator], timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def rounded(n: int) -> int:
    return 0 if n == 0 else -(-n // 512) * 512


LINEAR = """
B, IN, OUT = 3, 10, 16
model = torch.nn.Linear(IN, OUT).cuda()
x = torch.randn(B, IN, device="cuda")
with Tracer(model) as t:
    y = model(x)
    rep = t.activations().to_dict()
    p = amem_alloc.provenance(y).to_dict()
    info = amem_alloc.cuda.block_info(x.data_ptr(), 0) if amem_alloc.is_enabled() else None
    yinfo = amem_alloc.cuda.block_info(y.data_ptr(), 0) if amem_alloc.is_enabled() else None
print(json.dumps({"rep": rep, "p": p, "x_block": info, "y_block": yinfo}))
"""


def test_native_allocator_gives_rounded_sizes():
    out = _run(LINEAR, "native")
    (row,) = out["rep"]["saved"]
    assert row["label"] == "AddmmBackward0.mat1" and row["nominal_bytes"] == 3 * 10 * 4
    assert (row["allocator"], row["exact"], row["allocator_bytes"]) == ("native", False, rounded(120))
    p = out["p"]
    assert p["device"] == "cuda:0" and p["allocator"] == "native" and p["block_size"] == rounded(3 * 16 * 4)
    assert any("not torch's CUDA allocator" in n for n in p["notes"])


def test_amem_gives_real_blocks_segments_and_sequence_numbers():
    out = _run(LINEAR, "amem")
    (row,) = out["rep"]["saved"]
    assert (row["allocator"], row["exact"]) == ("amem", True)
    assert row["allocator_bytes"] == out["x_block"]["size"] >= rounded(120)
    p = out["p"]
    assert p["allocator"] == "amem" and p["exact_size"]
    assert p["block_size"] == out["y_block"]["size"] and p["address"] == out["y_block"]["address"]
    assert p["alloc_seq"] == out["y_block"]["alloc_seq"] and p["stream"] == out["y_block"]["stream"]
    seg = p["segment"]
    assert seg is not None and seg["segment_type"] == "small"  # a small-pool segment
    assert seg["size"] % (2 << 20) == 0 and (seg["is_expandable"] or seg["size"] == 2 << 20)  # 2 MiB pages
    assert p["requested_bytes"] == 3 * 16 * 4


AUTOCAST = """
B, IN, H, OUT = 4, 8, 16, 4
model = torch.nn.Sequential(torch.nn.Linear(IN, H), torch.nn.LayerNorm(H), torch.nn.Linear(H, OUT)).cuda()
x = torch.randn(B, IN, device="cuda")
with Tracer(model) as t, torch.autocast("cuda", dtype=torch.float16):
    y = model(x)
print(json.dumps(t.activations().to_dict()))
"""


@pytest.mark.parametrize("allocator", ["native", "amem"])
def test_autocast_on_cuda_saves_half_copies_and_layernorm_runs_in_float32(allocator):
    rep = _run(AUTOCAST, allocator)
    B, IN, H, OUT = 4, 8, 16, 4
    by = {(r["module"], r["label"]): r for r in rep["saved"]}
    assert (by[("0", "AddmmBackward0.mat1")]["dtype"], by[("0", "AddmmBackward0.mat1")]["kind"]) == ("float16", "input_copy")
    w = by[("2", "AddmmBackward0.mat2")]
    assert (w["dtype"], w["kind"], w["counted"]) == ("float16", "parameter_copy", True)
    ln_in = by[("1", "NativeLayerNormBackward0.input")]
    assert ln_in["dtype"] == "float32" and ln_in["nominal_bytes"] == B * H * 4  # autocast's fp32 list
    for slot in ("weight", "bias"):
        assert by[("1", f"NativeLayerNormBackward0.{slot}")]["kind"] == "parameter"
    stats = [by[("1", f"NativeLayerNormBackward0.result{i}")] for i in (1, 2)]
    assert all(s["dtype"] == "float32" and s["nominal_bytes"] == B * 4 for s in stats)
    expected = [B * IN * 2, B * H * 4, B * 4, B * 4, B * H * 2, H * OUT * 2]
    assert rep["total"]["nominal_bytes"] == sum(expected)
    if allocator == "native":
        assert rep["total"]["allocator_bytes"] == sum(rounded(n) for n in expected)
    else:
        assert all(r["exact"] for r in rep["saved"] if r["counted"])
        assert rep["total"]["allocator_bytes"] >= sum(rounded(n) for n in expected)


MLP = """
from torch.utils.checkpoint import checkpoint
BATCH, WIDTH, DEPTH, SEGMENTS = 64, 1024, 16, 4
layers = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU())
                             for _ in range(DEPTH)).cuda()
def seg(x, i):
    for layer in layers[i * 4:(i + 1) * 4]:
        x = layer(x)
    return x
out = {}
for ckpt in (False, True):
    x = torch.randn(BATCH, WIDTH, device="cuda")
    with Tracer(layers) as t:
        h = x
        for i in range(SEGMENTS):
            h = checkpoint(seg, h, i, use_reentrant=False) if ckpt else seg(h, i)
        h.sum().backward()
    out[str(ckpt)] = t.activations().to_dict()
print(json.dumps(out))
"""


@pytest.mark.parametrize("allocator", ["native", "amem"])
def test_deep_mlp_with_and_without_checkpointing_on_cuda(allocator):
    out = _run(MLP, allocator)
    act = 64 * 1024 * 4
    plain, ckpt = out["False"], out["True"]
    assert plain["total"]["nominal_bytes"] == 17 * act and plain["total"]["storages"] == 17
    assert ckpt["total"]["nominal_bytes"] == 4 * act
    for rep, n in ((plain, 17), (ckpt, 4)):
        alloc = rep["total"]["allocator_bytes"]
        assert n * act <= alloc <= n * (act + 511)  # amem: a small-pool block is the request, or up to 511 B more
        if allocator == "native":
            assert alloc == n * rounded(act)
    assert plain["status"] == ckpt["status"] == "freed"
