"""Activation memory attributed to autograd nodes: the literature's cases, with every expected
figure derived here from first principles (element count x element size, and the GPU allocator's
512-byte rounding), never copied from a run."""
import pytest
import torch
from torch.utils.checkpoint import checkpoint

import amem_alloc
from amem_alloc import Tracer

F32, BF16 = 4, 2  # bytes per element


def gpu_rounded(nbytes: int) -> int:
    """torch's CUDA caching allocator: every request rounds up to a multiple of 512 bytes."""
    return 0 if nbytes == 0 else -(-nbytes // 512) * 512


def saved(report, label):
    rows = [r for r in report.saved if r["label"] == label]
    assert rows, f"{label} not among {[r['label'] for r in report.saved]}"
    return rows


def counted(report):
    return [r for r in report.saved if r["counted"]]


# ---------------------------------------------------------------- Linear and addition -----------

def test_linear_whose_input_needs_no_grad_saves_only_the_input():
    # addmm's backward needs mat2 (the weight) only for the input's gradient, which is not wanted
    B, IN, OUT = 3, 10, 16
    model, x = torch.nn.Linear(IN, OUT), torch.randn(B, IN)
    with Tracer(model) as t:
        y = model(x)  # kept: a graph nobody holds is freed at once, with what it saved
        rep = t.activations()
    assert [r["label"] for r in rep.saved] == ["AddmmBackward0.mat1"]
    (row,) = saved(rep, "AddmmBackward0.mat1")
    assert row["kind"] == "input" and row["what"] == "the model input"
    assert (row["dtype"], row["shape"]) == ("float32", [B, IN])
    assert row["nominal_bytes"] == B * IN * F32 == 120
    assert row["allocator_bytes"] == gpu_rounded(B * IN * F32) == 512
    assert rep.total == {"nominal_bytes": 120, "allocator_bytes": 512, "storages": 1}
    assert rep.module("")["total"]["nominal_bytes"] == 120
    assert {n["node"] for n in rep.nodes} == {"AddmmBackward0", "TBackward0"}
    assert rep.status == "live"
    del y


def test_linear_whose_input_needs_grad_also_saves_the_weight_which_is_not_activation_memory():
    B, IN, OUT = 3, 10, 16
    model, x = torch.nn.Linear(IN, OUT), torch.randn(B, IN, requires_grad=True)
    with Tracer(model) as t:
        y = model(x)
    rep = t.activations()
    (mat2,) = saved(rep, "AddmmBackward0.mat2")
    assert mat2["kind"] == "parameter" and mat2["what"] == "parameter weight" and not mat2["counted"]
    assert mat2["shape"] == [IN, OUT]  # weight.t(): a view of the parameter's storage
    assert rep["model_state_saved"]["nominal_bytes"] == IN * OUT * F32
    assert rep.total["nominal_bytes"] == B * IN * F32  # only the input counts


def test_addition_saves_nothing_and_multiplication_saves_both_operands():
    n = 1000
    a, b = torch.randn(n, requires_grad=True), torch.randn(n, requires_grad=True)
    with Tracer() as t:
        s = a + b
    rep = t.activations()
    assert [x["node"] for x in rep.nodes] == ["AddBackward0"] and rep.saved == []
    assert rep.total["nominal_bytes"] == 0 and rep.status == "nothing saved"
    with Tracer() as t2:
        p = a * b  # d(ab)/da = b, d(ab)/db = a: both are kept
    rep2 = t2.activations()
    assert sorted(r["label"] for r in rep2.saved) == ["MulBackward0.other", "MulBackward0.self"]
    assert rep2.total == {"nominal_bytes": 2 * n * F32, "allocator_bytes": 2 * gpu_rounded(n * F32), "storages": 2}
    assert all(r["kind"] == "external" for r in rep2.saved)  # made before the tracer
    del s, p


def test_storages_shared_by_several_nodes_count_once():
    # relu saves its output; the next Linear saves the same tensor as mat1: one storage, counted once
    B, H = 4, 32
    model = torch.nn.Sequential(torch.nn.Linear(H, H), torch.nn.ReLU(), torch.nn.Linear(H, H))
    with Tracer(model) as t:
        y = model(torch.randn(B, H))
    rep = t.activations()
    (relu,) = saved(rep, "ReluBackward0.result")
    mat1s = saved(rep, "AddmmBackward0.mat1")
    second = [r for r in mat1s if r["module"] == "2"][0]
    assert relu["counted"] and not second["counted"] and second["note"] == "shared with ReluBackward0.result"
    assert second["storage"] == relu["storage"]
    assert rep.total["nominal_bytes"] == 2 * B * H * F32  # the input, and the relu output
    assert rep.module("1")["self"]["nominal_bytes"] == B * H * F32
    assert rep.module("2")["self"]["nominal_bytes"] == 0


# ---------------------------------------------------------------- autocast ----------------------

def test_autocast_saves_reduced_precision_copies_and_layernorm_keeps_float32_state():
    B, IN, H, OUT = 4, 8, 16, 4
    model = torch.nn.Sequential(torch.nn.Linear(IN, H), torch.nn.LayerNorm(H), torch.nn.Linear(H, OUT))
    x = torch.randn(B, IN)
    with Tracer(model) as t, torch.autocast("cpu", dtype=torch.bfloat16):
        y = model(x)
    rep = t.activations()
    by = {(r["module"], r["label"]): r for r in rep.saved}
    fc1_in = by[("0", "AddmmBackward0.mat1")]
    assert (fc1_in["dtype"], fc1_in["kind"]) == ("bfloat16", "input_copy")
    assert fc1_in["what"] == "autocast copy of the model input (float32 -> bfloat16)"
    assert fc1_in["nominal_bytes"] == B * IN * BF16
    fc2_w = by[("2", "AddmmBackward0.mat2")]
    assert (fc2_w["dtype"], fc2_w["kind"], fc2_w["counted"]) == ("bfloat16", "parameter_copy", True)
    assert fc2_w["what"] == "autocast copy of parameter 2.weight (float32 -> bfloat16)"
    assert fc2_w["nominal_bytes"] == H * OUT * BF16  # a new storage: it is activation memory
    # LayerNorm: its affine parameters stay the float32 parameters (not copies, not counted), and
    # the statistics it saves (mean, rstd: one per row) are float32
    for slot in ("weight", "bias"):
        r = by[("1", f"NativeLayerNormBackward0.{slot}")]
        assert (r["dtype"], r["kind"], r["counted"]) == ("float32", "parameter", False)
    for slot in ("result1", "result2"):
        r = by[("1", f"NativeLayerNormBackward0.{slot}")]
        assert (r["dtype"], r["shape"], r["nominal_bytes"]) == ("float32", [B, 1], B * F32)
    ln_in = by[("1", "NativeLayerNormBackward0.input")]
    assert ln_in["what"] == "output of aten.addmm.default in 0" and ln_in["nominal_bytes"] == B * H * BF16
    expected = [B * IN * BF16, B * H * BF16, B * F32, B * F32, B * H * BF16, H * OUT * BF16]
    assert rep.total["nominal_bytes"] == sum(expected)
    assert rep.total["allocator_bytes"] == sum(gpu_rounded(n) for n in expected)
    assert rep.total["storages"] == len(expected)
    assert rep["by_kind"]["parameter_copy"]["nominal_bytes"] == H * OUT * BF16


# ---------------------------------------------------------------- a deep MLP, and checkpointing -

BATCH, WIDTH, DEPTH, SEGMENTS = 64, 1024, 16, 4
ACT = BATCH * WIDTH * F32  # one activation: 256 KiB


class MLP(torch.nn.Module):
    def __init__(self, checkpointed: bool):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()) for _ in range(DEPTH))
        self.checkpointed = checkpointed

    def segment(self, x, i):
        per = DEPTH // SEGMENTS
        for layer in self.layers[i * per:(i + 1) * per]:
            x = layer(x)
        return x

    def forward(self, x):
        for i in range(SEGMENTS):
            x = checkpoint(self.segment, x, i, use_reentrant=False) if self.checkpointed else self.segment(x, i)
        return x


def _train_step(checkpointed: bool):
    model, x = MLP(checkpointed), torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(1))
    with Tracer(model) as t:
        model(x).sum().backward()
    return t, model


@pytest.fixture(scope="module")
def mlp_runs():
    return {c: _train_step(c) for c in (False, True)}


def test_deep_mlp_without_checkpointing_keeps_every_layer_output(mlp_runs):
    t, _ = mlp_runs[False]
    rep = t.activations()
    # the input (saved by the first addmm) and each of the 16 ReLU outputs (saved by ReluBackward0
    # and, the same storage, by the next layer's addmm); the Linear outputs themselves are not kept
    assert rep.total == {"nominal_bytes": (1 + DEPTH) * ACT, "allocator_bytes": (1 + DEPTH) * gpu_rounded(ACT),
                         "storages": 1 + DEPTH}
    assert rep.total["nominal_bytes"] == 17 * 262144
    assert rep.module("layers.0")["total"]["nominal_bytes"] == 2 * ACT  # the input and its ReLU output
    assert rep.module("layers.7")["total"]["nominal_bytes"] == ACT
    weights = [r for r in rep.saved if r["kind"] == "parameter"]
    assert len(weights) == DEPTH - 1 and not any(r["counted"] for r in weights)
    assert rep.status == "freed" and "backward has freed" in rep.message


def test_deep_mlp_with_checkpointing_keeps_only_the_checkpoint_inputs(mlp_runs):
    t, _ = mlp_runs[True]
    rep = t.activations()
    kept = [r for r in counted(rep) if r["nominal_bytes"]]
    assert len(kept) == SEGMENTS and all(r["holder"] == "checkpoint" or "Noop" in (r["node"] or "") for r in kept)
    assert rep.total["nominal_bytes"] == SEGMENTS * ACT == 4 * 262144
    assert rep.total["allocator_bytes"] == SEGMENTS * gpu_rounded(ACT)
    assert {r["what"] for r in kept} == {"the model input", "output of aten.relu.default in layers.3.1",
                                         "output of aten.relu.default in layers.7.1",
                                         "output of aten.relu.default in layers.11.1"}
    held = [r for r in rep.saved if r["state"] == "other_hooks"]
    assert held and all(r["note"] == "checkpointed: not kept, recomputed in backward" for r in held)
    assert rep["held_by_other_hooks"]["tensors"] == len(held)


def test_the_report_shows_both_figures_side_by_side(mlp_runs):
    plain, ckpt = mlp_runs[False][0], mlp_runs[True][0]
    text = amem_alloc.provenance.compare(plain, ckpt, labels=("without checkpoint", "with checkpoint"))
    total = [line for line in text.splitlines() if line.strip().startswith("total allocator bytes")][0]
    assert "4.25 MiB" in total and "1.00 MiB" in total  # 17 x 256 KiB and 4 x 256 KiB
    assert "without checkpoint" in text and "with checkpoint" in text
    assert "layers.0" in text
    printed = plain.report(file=open("/dev/null", "w"), compare=ckpt, labels=("plain", "checkpointed"))
    assert "Activation memory side by side" in printed


def test_the_tracer_changes_no_result(mlp_runs):
    torch.manual_seed(0)
    ref = MLP(False)
    ref(torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(1))).sum().backward()
    for traced_model in (mlp_runs[False][1], mlp_runs[True][1]):
        for p, q in zip(ref.parameters(), traced_model.parameters()):
            assert torch.equal(p.grad, q.grad)
