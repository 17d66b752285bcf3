"""Inductor's buffers in a compiled region (amem_alloc/predict/engine/inductor_replay.py): the graph's
wrapper, as inductor generated it, replayed on the session's fake tensors.

The references: what fusion means from first principles (a chain of pointwise ops and a reduction
is one kernel, which writes only its output), and inductor's own plan read independently of the
replay: the wrapper's text walked line by line (`bufN = empty_strided_cuda(sizes, strides, dtype)`,
`bufN = bufM; del bufM  # reuse`, `del bufN`, the returned buffers kept), giving the bytes alive
after each line. The replay executes that module; the walk only reads it."""
from __future__ import annotations

import ast
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch._inductor.compile_fx")

from amem_alloc.predict.engine import compile_trace  # noqa: E402
from amem_alloc.predict.engine.compiled import COMPILED, OP_BY_OP  # noqa: E402
from amem_alloc.predict.engine.session import FakeCudaSession  # noqa: E402
from amem_alloc.replay import ALLOC  # noqa: E402
from test_predict_compile import H100, HIDDEN, TOKENS, VOCAB, Region, lm_head_loss, lm_inputs, mlp, mlp_inputs  # noqa: E402


def chain(x):
    return ((x * 2 + 1).relu() * 3).sum(-1)


# ============================================================================ the prediction's allocations
def allocations(s, start: str, end: str) -> list[int]:
    """Sizes allocated between two markers, in order (cuBLAS's workspace aside)."""
    marks = dict((name, i) for i, name in s.markers)
    return [size for kind, key, size, _ in s.ops[marks[start]:marks[end]]
            if kind == ALLOC and s.infos[key].op != "cublas_workspace"]


def live_between(s, start: str, end: str) -> list[int]:
    """Bytes allocated (cuBLAS's workspace aside) after each event between two markers, relative to
    the first marker."""
    marks = dict((name, i) for i, name in s.markers)
    sizes, now, out = {}, 0, []
    for i, (kind, key, size, _) in enumerate(s.ops[:marks[end]]):
        if kind == ALLOC:
            sizes[key] = 0 if s.infos[key].op == "cublas_workspace" else size
            now += sizes[key]
        else:
            now -= sizes.pop(key, 0)
        if i == marks[start] - 1:
            base = now
        if i >= marks[start]:
            out.append(now - base)
    return out


# ============================================================================ the wrapper, walked
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4, "bool": 1, "uint8": 1, "float64": 8}
_ALLOC = re.compile(r"^(\w+) = empty_strided_cuda\(\(([^)]*)\), \(([^)]*)\), torch\.(\w+)\)$")
_ALIAS = re.compile(r"^(\w+) = (?:reinterpret_tensor\()?(\w+)\b.*; del (\w+)  # reuse$")


def _nbytes(sizes: str, strides: str, dtype: str) -> int:
    dims = [int(d) for d in sizes.split(",") if d.strip()]
    steps = [int(d) for d in strides.split(",") if d.strip()]
    if 0 in dims:
        return 0
    return (1 + sum((d - 1) * st for d, st in zip(dims, steps))) * _DTYPE_BYTES[dtype]


def walk(wrapper: str, inputs: dict[str, int]) -> tuple[list[int], list[str]]:
    """The bytes alive after each line of the wrapper's `call`, relative to its start (an input in
    `inputs`, name -> bytes, is freed by its `del`; other inputs are held by their owners), and the
    names it returns."""
    body = wrapper.split("    def call(self, args):", 1)[1].split("\nrunner = ", 1)[0]
    owner, size, now, trace = dict(), dict(inputs), 0, []
    owner.update({name: name for name in inputs})
    returned = []
    for line in (raw.strip() for raw in body.splitlines()):
        if m := _ALLOC.match(line):
            owner[m[1]], size[m[1]] = m[1], _nbytes(m[2], m[3], m[4])
            now += size[m[1]]
        elif m := _ALIAS.match(line):
            owner[m[1]] = owner.pop(m[3])
        elif line.startswith("del "):
            base = owner.pop(line[4:], None)
            if base is not None and base not in owner.values():
                now -= size.get(base, 0)
        elif line.startswith("return ("):
            returned = [owner.get(n, n) for n in _returned_names(line)]
        trace.append(now)
    return trace, returned


def _returned_names(line: str) -> list:
    """`return (buf4, primals_1, reinterpret_tensor(buf1, ...), None, )`: each item's buffer name."""
    items = ast.parse(line.replace("return ", "", 1)).body[0].value.elts
    return [(e.args[0] if isinstance(e, ast.Call) else e).__dict__.get("id") for e in items]


def predicted_region(fn, make_inputs, autocast: bool, grad: bool = True):
    s = FakeCudaSession(**H100)
    with s:
        x, weights, rest = make_inputs()
        run = torch.compile(Region(fn, *weights))
        s.marker("forward")
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast), torch.set_grad_enabled(grad):
            out = run(x, *rest)
        s.marker("backward")
        if grad:
            out.backward()
        s.marker("end")
    plan, = run.dynamo_ctx.region.plans.values()   # (torch.compile gave an OptimizedModule)
    return s, plan


# ============================================================================ tests
def test_a_chain_of_pointwise_ops_and_a_reduction_allocates_only_its_output():
    rows, cols = 1024, 4096
    make = lambda: (torch.randn(rows, cols, device="cuda"), [], [])  # noqa: E731
    s, plan = predicted_region(chain, make, autocast=False, grad=False)
    assert s.compile_regions[0]["status"] == COMPILED, s.compile_regions
    assert allocations(s, "forward", "backward") == [rows * 4]   # one fused kernel: the sums only
    eager = FakeCudaSession(**H100)
    with eager:
        x = torch.randn(rows, cols, device="cuda")
        eager.marker("forward")
        with torch.no_grad():
            chain(x)
        eager.marker("backward")
    assert allocations(eager, "forward", "backward") == [rows * cols * 4] * 4 + [rows * 4]   # one per op


def test_mlp_allocates_the_matmuls_and_one_fused_gelu_and_reuses_the_gradient_in_place():
    s, plan = predicted_region(mlp, mlp_inputs, autocast=False)
    assert s.compile_regions[0]["status"] == COMPILED, s.compile_regions
    rows, hidden, inner = TOKENS // 8, HIDDEN // 8, HIDDEN // 2
    forward = allocations(s, "forward", "backward")
    assert forward[:3] == [rows * inner * 4, rows * inner * 4, rows * hidden * 4]   # mm, GELU (fused), mm
    assert all(size < rows * hidden * 4 for size in forward[3:])   # then the sum's partial sums
    # backward: the hidden gradient is computed once and GELU's backward writes it in place
    backward = allocations(s, "backward", "end")
    assert backward.count(rows * inner * 4) == 1, backward


@pytest.mark.parametrize("fn, make, autocast", [(mlp, mlp_inputs, False), (lm_head_loss, lm_inputs, True)],
                         ids=["mlp", "lm_head_cross_entropy"])
def test_each_graphs_bytes_are_those_of_inductors_wrapper_walked(fn, make, autocast):
    s, plan = predicted_region(fn, make, autocast=autocast)
    assert s.compile_regions[0]["status"] == COMPILED, s.compile_regions
    fw_trace, fw_returned = walk(plan.forward.wrapper, {})
    assert max(live_between(s, "forward", "backward")) == max(fw_trace)
    assert live_between(s, "forward", "backward")[-1] == fw_trace[-1]
    # backward: its arguments are the forward's saved outputs, freed where the wrapper `del`s them
    sizes = _returned_sizes(plan.forward.wrapper)
    args = re.search(r"def call\(self, args\):\n\s+(.*) = args", plan.backward.wrapper)[1].replace(" ", "").split(",")
    saved = {name: sizes.get(ret, 0) for name, ret in zip(args, fw_returned[plan.n_user:])}
    bw_trace, _ = walk(plan.backward.wrapper, saved)
    seed = 4   # backward's incoming gradient of the scalar loss (ones_like)
    assert max(live_between(s, "backward", "end")) == seed + max(bw_trace)


def _returned_sizes(wrapper: str) -> dict[str, int]:
    return {m[1]: _nbytes(m[2], m[3], m[4]) for m in (_ALLOC.match(line.strip()) for line in wrapper.splitlines()) if m}


def test_the_lm_heads_logits_gradient_is_written_where_the_saved_logits_were():
    """Inductor's backward reuses the saved bf16 logits for their gradient (`buf1 = mm; del mm  # reuse`):
    no logits-sized buffer is allocated in backward, where eager allocates fp32 gradients of them."""
    s, plan = predicted_region(lm_head_loss, lm_inputs, autocast=True)
    assert "= mm; del mm  # reuse" in plan.backward.wrapper
    assert max(allocations(s, "backward", "end")) < TOKENS * VOCAB * 2
    assert max(allocations(s, "backward", "end")) == VOCAB * HIDDEN * 4   # the fp32 weight gradient


def test_where_the_wrapper_cannot_be_generated_the_graph_runs_op_by_op_and_says_why(monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("no wrapper here")
    monkeypatch.setattr(compile_trace, "_codegen", fail)
    s, _ = predicted_region(mlp, mlp_inputs, autocast=False)
    status = s.compile_regions[0]["status"]
    assert status == OP_BY_OP.format(why="RuntimeError: no wrapper here"), status


def biased_mlp(x, w1, b1, w2):
    return torch.nn.functional.linear(torch.nn.functional.gelu(torch.nn.functional.linear(x, w1, b1)), w2).sum()


def test_max_autotune_assumes_atens_kernels_and_says_so():
    """Which GEMM kernel max-autotune picks is benchmarked on the GPU: ATen's is assumed, as torch
    picks when it does not benchmark (select_algorithm's pick_deterministic_choice), and noted."""
    def make():
        x, (w1, w2), _ = mlp_inputs()
        return x, [w1, torch.nn.Parameter(torch.randn(w1.shape[0], device="cuda")), w2], []
    s = FakeCudaSession(**H100)
    with s:
        x, weights, _ = make()
        run = torch.compile(Region(biased_mlp, *weights), mode="max-autotune-no-cudagraphs")
        run(x).backward()
    assert s.compile_regions[0]["status"] == COMPILED, s.compile_regions
    plan, = run.dynamo_ctx.region.plans.values()   # (torch.compile gave an OptimizedModule)
    for graph in (plan.forward, plan.backward):
        assert "extern_kernels." in graph.wrapper and "triton_tem" not in graph.wrapper
    assert any(n.what == compile_trace.AUTOTUNE_ESTIMATE for n in s.notes.items.values())


def pointwise(x):
    return (x * 2 + 1).relu()


def test_an_expanded_gradient_is_copied_into_the_traced_tangents_layout_as_aotautograd_does():
    """`out.sum().backward()` hands the region a gradient expanded from one element (stride 0);
    AOTAutograd's backward makes it contiguous, as the tangent was traced (a copy), before the
    graph runs (runtime_wrappers.py, coerce_to_expected_memory_format)."""
    rows, cols = 1024, 4096
    s = FakeCudaSession(**H100)
    with s:
        x = torch.randn(rows, cols, device="cuda", requires_grad=True)
        out = torch.compile(Region(pointwise))(x)
        s.marker("backward")
        out.sum().backward()
        s.marker("end")
    assert s.compile_regions[0]["status"] == COMPILED, s.compile_regions
    # the sum and its seed, the tangent made contiguous, x's gradient (one fused kernel)
    assert allocations(s, "backward", "end") == [4, 4, rows * cols * 4, rows * cols * 4]


def attention(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


class Attention(torch.nn.Module):
    def forward(self, q, k, v):
        return attention(q, k, v)


def test_attention_in_a_compiled_region_runs_the_kernel_the_card_would_choose():
    """On an H100, causal bf16 attention with head dim 64 runs a fused kernel (sdp_utils.cpp: cuDNN's
    where `check_prefer_cudnn_attention` holds, as with torch 2.14's cuDNN on capability 9.0, else
    flash), which AOTAutograd records as its own op: the forward saves the output and the per-row
    logsumexp, never the T x T scores (the math path, which a trace finding no card records)."""
    b, h, t, d = 8, 12, 1024, 64
    s = FakeCudaSession(**H100)
    with s:
        q, k, v = (torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        run = torch.compile(Attention())
        s.marker("forward")
        out = run(q, k, v)
        s.marker("backward")
        out.backward(torch.ones_like(out))
        s.marker("end")
    assert s.compile_regions[0]["status"] == COMPILED, s.compile_regions
    plan, = run.dynamo_ctx.region.plans.values()   # (torch.compile gave an OptimizedModule)
    fused = re.search(r"_scaled_dot_product_(cudnn|flash)_attention\.default\(", plan.forward.wrapper)
    assert fused, "no fused attention kernel in the forward"
    assert f"_scaled_dot_product_{fused[1]}_attention_backward.default(" in plan.backward.wrapper
    scores = b * h * t * t * 2
    assert max(allocations(s, "forward", "end")) < scores
    out_bytes, logsumexp = b * h * t * d * 2, b * h * t * 4
    assert s.compile_regions[0]["saved_bytes"] - out_bytes - logsumexp < 64   # and flash's RNG seed and offset


def test_a_saved_tensor_inductor_pads_reaches_backward_with_its_padded_strides():
    """Inductor pads the strides of some buffers (ReLU's bool mask of 222 x 222 images here) and tells
    AOTAutograd the forward's output strides, so the backward is lowered for the padded tensor; the
    padded bytes are what is allocated."""
    s = FakeCudaSession(**H100)
    with s:
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 3), torch.nn.BatchNorm2d(64), torch.nn.ReLU()).cuda()
        run = torch.compile(model)
        s.marker("forward")
        out = run(torch.randn(32, 3, 224, 224, device="cuda"))
        s.marker("backward")
        out.sum().backward()
        s.marker("end")
    assert s.compile_regions[0]["status"] == COMPILED, s.compile_regions
    plan, = run.dynamo_ctx.region.plans.values()   # (torch.compile gave an OptimizedModule)
    padded = [size for name, size in _returned_sizes(plan.forward.wrapper).items()
              if size > 32 * 64 * 222 * 222 and size % (32 * 64 * 222 * 222)]   # a padded buffer
    assert padded, "inductor padded nothing here"
    assert set(padded) <= set(allocations(s, "forward", "backward"))


def norm(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b).square().sum()


def norm_with_a_break(x, w, b):
    y = torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b)
    torch._dynamo.graph_break()   # dynamo's graphs one by one (graph_breaks.py)
    return y.square().sum()


def _norm_predicted(options=None, fn=norm, **config):
    """A layer norm's forward and backward compiled: its backward reduces the gradient both ways
    (over rows for the weight's, over columns for the input's), which inductor generates as one
    mix-order reduction whose split it may benchmark."""
    s = FakeCudaSession(**H100)
    with s, torch._inductor.config.patch(**config):
        x = torch.randn(8192, 768, device="cuda", requires_grad=True)
        w, b = (torch.nn.Parameter(torch.full((768,), v, device="cuda")) for v in (1.0, 0.0))
        torch.compile(Region(fn, w, b), options=options)(x).backward()
    return s, [size for kind, _, size, _ in s.ops if kind == ALLOC]


def test_coordinate_descent_tuning_keeps_inductors_starting_split_and_says_so():
    """With coordinate-descent tuning (llm.c's train_gpt2.py sets it), inductor benchmarks the split
    of a mix-order reduction while it generates code, which loads and runs a kernel on the GPU. The
    split it starts from is torch's own pick when it does not tune (simd.py's _pick_split_size), so
    the prediction's allocations are those of the untuned compile, and the estimate is said."""
    plain, plain_sizes = _norm_predicted()
    tuned, tuned_sizes = _norm_predicted(coordinate_descent_tuning=True)
    assert tuned.compile_regions[0]["status"] == COMPILED, tuned.compile_regions
    assert tuned_sizes == plain_sizes
    said = [n.what for n in tuned.notes.items.values()]
    assert compile_trace.SPLIT_ESTIMATE in said, said
    assert compile_trace.SPLIT_ESTIMATE not in [n.what for n in plain.notes.items.values()]


def test_a_kept_wrapper_says_the_estimates_its_code_generation_made(tmp_path, monkeypatch):
    monkeypatch.setenv("AMEM_COMPILE_CACHE", str(tmp_path))
    for _ in range(2):   # generated, then kept
        tuned, _ = _norm_predicted(coordinate_descent_tuning=True)
        assert compile_trace.SPLIT_ESTIMATE in [n.what for n in tuned.notes.items.values()]
    assert len(list(tmp_path.glob("*.json"))) == 2   # forward and backward wrappers kept


def test_fusion_by_benchmark_takes_inductors_heuristics_even_where_the_program_asks_for_it():
    """`benchmark_fusion` (given in torch.compile's options, which win over the config) would run
    each candidate fusion's kernels; inductor's heuristic fusions are assumed, and said."""
    _, plain_sizes = _norm_predicted()
    s, sizes = _norm_predicted(options={"benchmark_fusion": True})
    assert s.compile_regions[0]["status"] == COMPILED, s.compile_regions
    assert sizes == plain_sizes
    assert compile_trace.FUSION_ESTIMATE.format(flags="benchmark_fusion") in [n.what for n in s.notes.items.values()]


def test_fusion_by_benchmark_is_kept_off_graph_by_graph_too():
    """A region dynamo breaks into graphs compiles each on its own (graph_breaks.py), with the
    program's options too: those must not undo the trace's either."""
    s, _ = _norm_predicted(options={"benchmark_fusion": True}, fn=norm_with_a_break)
    region, = s.compile_regions
    assert [g["status"] for g in region["graphs"]] == [COMPILED, COMPILED], region
    assert compile_trace.FUSION_ESTIMATE.format(flags="benchmark_fusion") in [n.what for n in s.notes.items.values()]
