"""torch.compile predicted as compiled (amem_alloc/predict/engine/compiled.py, compile_trace.py).

The reference is torch's own partition, worked out here from first principles: AOTAutograd run
directly (`aot_function`) with inductor's decompositions and inductor's partition function (its
joint-graph passes, then `min_cut_rematerialization_partition`), on torch's fake tensors of this
machine's CPU, where torch's autograd engine runs as it is. The CPU reference writes out the casts
CUDA's autocast makes (linear in bf16; cross_entropy in fp32: aten/src/ATen/autocast_mode.cpp's
lists), so its graph is the one the compiled region has on CUDA. The prediction must save, byte
for byte, what that partition saves, and leave alive after forward exactly that plus the output."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch._inductor.compile_fx")

from amem_alloc.predict.engine.session import FakeCudaSession  # noqa: E402
from amem_alloc.replay import ALLOC  # noqa: E402

H100 = dict(capability=(9, 0), device_name="NVIDIA H100 80GB HBM3")
TOKENS, HIDDEN, VOCAB = 16384, 4096, 128256   # the LM head (Llama 3 8B, 16,384 tokens)


def torch_saved_bytes(fn, *shapes_dtypes) -> int:
    """Bytes the forward graph saves for backward (its outputs after the user's that it made
    itself), as AOTAutograd with inductor's decompositions and partitioner decides, on CPU fakes."""
    from torch._functorch.aot_autograd import aot_function
    from torch._inductor.compile_fx import partition_fn
    from torch._inductor.decomposition import select_decomp_table
    from torch._subclasses import FakeTensorMode

    seen = {}

    def partition(joint, joint_inputs, **kwargs):
        fw, bw = seen["fw"], seen["bw"] = partition_fn(joint, joint_inputs, **kwargs)
        return fw, bw

    with FakeTensorMode():
        args = [torch.empty(shape, dtype=dtype).requires_grad_(grad) for shape, dtype, grad in shapes_dtypes]
        compiled = aot_function(fn, fw_compiler=lambda gm, _: gm, partition_fn=partition,
                                decompositions=select_decomp_table())
        compiled(*args)
    seen["n_saved"] = sum(1 for n in seen["bw"].graph.nodes if n.op == "placeholder" and not n.name.startswith("tangents"))
    nodes = list(seen["fw"].graph.nodes)
    out = nodes[-1].args[0]
    inputs = {id(n.meta["val"].untyped_storage()) for n in nodes if n.op == "placeholder"}
    saved = {id(st): st.nbytes() for st in (n.meta["val"].untyped_storage() for n in out[len(out) - seen["n_saved"]:])
             if id(st) not in inputs}   # what it made itself: neither inputs nor views of them
    return sum(saved.values())


def lm_head_loss_cpu(x, w, y):
    """What the CUDA region computes under bf16 autocast, casts written out."""
    logits = torch.nn.functional.linear(x.to(torch.bfloat16), w.to(torch.bfloat16))
    return torch.nn.functional.cross_entropy(logits.float(), y)


def lm_head_loss(x, w, y):
    return torch.nn.functional.cross_entropy(torch.nn.functional.linear(x, w), y)


def mlp(x, w1, w2):
    return torch.nn.functional.linear(torch.nn.functional.gelu(torch.nn.functional.linear(x, w1)), w2).sum()


class Region(torch.nn.Module):
    """`fn` over the module's weights: torch.compile predicts compiled modules as compiled."""

    def __init__(self, fn, *weights):
        super().__init__()
        self.fn, self.weights = fn, torch.nn.ParameterList(weights)

    def forward(self, x, *rest):
        return self.fn(x, *self.weights, *rest)


def survivors(s, start: str, end: str) -> int:
    """Bytes allocated between two markers and still alive at the second (the cuBLAS workspace aside)."""
    marks = dict((name, i) for i, name in s.markers)
    live = {}
    for kind, key, size, _ in s.ops[marks[start]:marks[end]]:
        if kind == ALLOC:
            if s.infos[key].op != "cublas_workspace":
                live[key] = size
        else:
            live.pop(key, None)
    return sum(live.values())


def predicted(fn, compiled: bool, make_inputs, autocast: bool):
    s = FakeCudaSession(**H100)
    with s:
        x, weights, rest = make_inputs()
        module = Region(fn, *weights)
        run = torch.compile(module) if compiled else module
        inputs = (x, *rest)
        s.marker("forward")
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = run(*inputs)
        s.marker("backward")
        loss.backward()
        s.marker("end")
    return s, loss


def lm_inputs():
    x = torch.randn(TOKENS, HIDDEN, device="cuda", requires_grad=True)
    w = torch.nn.Parameter(torch.randn(VOCAB, HIDDEN, device="cuda"))
    y = torch.randint(0, VOCAB, (TOKENS,), device="cuda")
    return x, [w], [y]


def mlp_inputs():
    return (torch.randn(TOKENS // 8, HIDDEN // 8, device="cuda", requires_grad=True),
            [torch.nn.Parameter(torch.randn(HIDDEN // 2, HIDDEN // 8, device="cuda")),
             torch.nn.Parameter(torch.randn(HIDDEN // 8, HIDDEN // 2, device="cuda"))], [])


def test_lm_head_and_cross_entropy_save_what_torchs_partitioner_saves():
    want = torch_saved_bytes(lm_head_loss_cpu, ((TOKENS, HIDDEN), torch.float32, True),
                             ((VOCAB, HIDDEN), torch.float32, True), ((TOKENS,), torch.int64, False))
    s, loss = predicted(lm_head_loss, True, lm_inputs, autocast=True)
    region, = s.compile_regions
    assert region["status"].startswith("predicted as compiled (inductor)"), region
    assert region["region"] == "Region"
    assert region["saved_bytes"] == want
    assert survivors(s, "forward", "backward") == want + 4   # and the fp32 loss, a scalar
    # eager saves the fp32 log_softmax output and linear's bf16 inputs (autocast's casts of x and w)
    eager = TOKENS * VOCAB * 4 + VOCAB * HIDDEN * 2 + TOKENS * HIDDEN * 2
    assert 0.55 < want / eager < 0.57, want / eager   # the 0.56x: bf16 logits and per-row statistics


def test_linear_gelu_linear_saves_what_eager_saves():
    want = torch_saved_bytes(mlp, ((TOKENS // 8, HIDDEN // 8), torch.float32, True),
                             ((HIDDEN // 2, HIDDEN // 8), torch.float32, True), ((HIDDEN // 8, HIDDEN // 2), torch.float32, True))
    s, _ = predicted(mlp, True, mlp_inputs, autocast=False)
    assert s.compile_regions[0]["saved_bytes"] == want
    assert survivors(s, "forward", "backward") == want + 4
    eager, _ = predicted(mlp, False, mlp_inputs, autocast=False)
    assert survivors(eager, "forward", "backward") == want + 4


B, T, HEADS, HEAD_DIM = 8, 512, 8, 64


def attention(x, w, flash=False):
    """A QKV projection and causal attention with dropout 0.2, in bf16 (nanoGPT's attention)."""
    q, k, v = torch.nn.functional.linear(x, w).view(B, T, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)
    if flash:   # the kernel an H100 takes for it, written out for the CPU reference
        out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.2, True, False)[0]
    else:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.2, is_causal=True)
    return out.float().sum()


def attention_inputs():
    return (torch.randn(B, T, HEADS * HEAD_DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True),
            [torch.nn.Parameter(torch.randn(3 * HEADS * HEAD_DIM, HEADS * HEAD_DIM, device="cuda",
                                            dtype=torch.bfloat16))], [])


def test_attention_in_a_compiled_region_is_the_cards_kernel():
    """On an H100, bf16 attention with head dim 64 and dropout 0.2 is flash attention (cuDNN takes no
    dropout that is not a multiple of 1/16: sdp_utils.cpp check_cudnn_dropout; flash is next in
    torch's order), which saves its output and log-sum-exp; without a GPU torch's own choice during
    the trace found no card and took the math path, saving the (B, H, T, T) weights. The region
    saves what torch's partition saves with flash written out (on CPU fakes), to the byte."""
    d = HEADS * HEAD_DIM
    want = torch_saved_bytes(lambda x, w: attention(x, w, flash=True), ((B, T, d), torch.bfloat16, True),
                             ((3 * d, d), torch.bfloat16, True))
    s, _ = predicted(attention, True, attention_inputs, autocast=False)
    region, = s.compile_regions
    assert region["status"].startswith("predicted as compiled (inductor)"), region
    assert region["saved_bytes"] == want
    assert want < B * HEADS * T * T * 2   # less than one bf16 T x T per head (the math path saves several)


def broken(x, w):
    y = x * w
    torch._dynamo.graph_break()
    return (y * 3).sum()


def test_a_graph_break_runs_eager_and_says_why():
    s = FakeCudaSession(**H100)
    with s:
        region = torch.compile(Region(broken, torch.nn.Parameter(torch.randn(64, 64, device="cuda"))))
        region(torch.randn(64, 64, device="cuda")).backward()
    region, = s.compile_regions
    assert region["status"].startswith("runs as eager: dynamo made 2 graphs"), region
    assert any("runs as eager" in n.what for n in s.notes.items.values())


def test_a_compiled_function_runs_eager_and_says_why():
    s = FakeCudaSession(**H100)
    with s:
        torch.compile(mlp)(*mlp_inputs()[0:1], *mlp_inputs()[1]).backward()
    assert not s.compile_regions
    assert any("torch.compile of a function: runs as eager" in n.what for n in s.notes.items.values())


def test_ranks_after_a_compiled_backward_are_recorded_here_not_in_forked_workers(monkeypatch):
    """A compiled region's traced backward can start torch's autograd device threads (pt_autograd_N),
    and a child forked after refuses every backward: with those threads running, ranks are recorded
    in this process, in turn, and no worker is forked. (Whether this process has them depends on
    what ran before, so their presence is given here.)"""
    from pathlib import Path

    from amem_alloc.predict.distributed import recording
    from amem_alloc.predict.distributed.launch import Launch
    from amem_alloc.predict.distributed.ranks import predict_ranks

    predicted(mlp, True, mlp_inputs, autocast=False)
    monkeypatch.setattr(recording, "_autograd_threads", lambda: True)
    monkeypatch.setattr(recording, "_Pool", lambda *a, **k: pytest.fail("a worker was forked"))
    assert not recording._can_fork()
    script = Path(__file__).parent / "predict_models" / "dist_ddp.py"
    result = predict_ranks(Launch(3, 1, None), [str(script)], "H100", "torch", steps=1, workers=2, timeout=300)
    assert [r.rank for r in result.ranks] == [0, 1, 2]
