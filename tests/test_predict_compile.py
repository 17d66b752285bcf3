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


N, D = 4096, 512


def kv_views(x, w):
    """A projection whose slices are returned as views (as a KV cache keeps keys and values) with a loss."""
    qkv = torch.nn.functional.linear(x, w)
    return qkv[:, :D].relu().sum(), qkv[:, D:2 * D], qkv[:, 2 * D:]


def kv_inputs():
    return (torch.randn(N, D, device="cuda", requires_grad=True),
            [torch.nn.Parameter(torch.randn(3 * D, D, device="cuda"))], [])


def test_a_region_returning_views_of_its_intermediate_is_predicted_as_compiled():
    """AOTAutograd returns the projection once (as the views' base) and regenerates the two views
    from it; the replay does the same: the region is compiled, not eager, it saves what torch's
    partition saves, and after forward the views hold the one projection (not copies of it)."""
    want = torch_saved_bytes(lambda x, w: kv_views(x, w)[0], ((N, D), torch.float32, True),
                             ((3 * D, D), torch.float32, True))
    s = FakeCudaSession(**H100)
    with s:
        x, weights, _ = kv_inputs()
        run = torch.compile(Region(kv_views, *weights))
        s.marker("forward")
        loss, k, v = run(x)
        s.marker("backward")
        assert k.untyped_storage().nbytes() == v.untyped_storage().nbytes() == N * 3 * D * 4
        assert (k.shape, k.stride(), k.storage_offset(), v.storage_offset()) == ((N, D), (3 * D, 1), D, 2 * D)
        loss.backward()
        s.marker("end")
    region, = s.compile_regions
    assert region["status"] == "predicted as compiled (inductor)", region
    assert [(g["status"], g["saved_bytes"]) for g in region["graphs"]] == [(region["status"], want)]
    assert survivors(s, "forward", "backward") == want + N * 3 * D * 4 + 4   # and the loss


def conv_relu_conv(x, w1, w2):
    return torch.nn.functional.conv2d(torch.nn.functional.conv2d(x, w1, padding=1).relu(), w2, padding=1).sum()


def test_a_channels_last_convolution_is_laid_out_as_cudnn_lays_it_out(monkeypatch):
    """With no GPU here torch's own choice of convolution backend, while inductor traces, finds no
    cuDNN and takes its slow kernel, always contiguous; on the card cuDNN returns channels-last
    for channels-last inputs, as the replay's convolution does (rules/convolution.py): inductor's
    wrapper checked the replay's output against the contiguous layout it was traced with and the
    prediction failed (torchvision's ResNet compiled in channels-last). The region is compiled,
    its output channels-last, every buffer as inductor laid it out (its wrapper's own size and
    stride checks, which the replay otherwise passes, run here), and it saves what torch's
    partition saves."""
    from amem_alloc.predict.engine import inductor_replay

    checked = []

    def check(t, size, stride, op_name=None):
        checked.append(op_name)
        torch._C._dynamo.guards.assert_size_stride(t, size, stride, op_name)
    monkeypatch.setitem(inductor_replay._STAND_INS, "assert_size_stride", check)
    monkeypatch.setitem(inductor_replay._STAND_INS, "assert_tensor_metadata",
                        lambda t, size, stride, dtype, op_name=None: check(t, size, stride, op_name))
    shapes = ((8, 32, 56, 56), (32, 32, 3, 3), (32, 32, 3, 3))
    want = torch_saved_bytes(conv_relu_conv, *((shape, torch.bfloat16, True) for shape in shapes))
    s = FakeCudaSession(**H100)
    with s:
        x, w1, w2 = (torch.randn(shape, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
                     .requires_grad_() for shape in shapes)
        inner = torch.compile(lambda a, b: torch.nn.functional.conv2d(a, b, padding=1))
        assert inner(x, w1).is_contiguous(memory_format=torch.channels_last)
        run = torch.compile(conv_relu_conv)
        run(x, w1, w2).backward()
    assert [r["status"] for r in s.compile_regions] == ["predicted as compiled (inductor)"] * 2, s.compile_regions
    assert s.compile_regions[1]["saved_bytes"] == want
    assert "torch.ops.aten.convolution.default" in checked, checked


def first_half(x, w1):
    return torch.nn.functional.gelu(torch.nn.functional.linear(x, w1))


@torch._dynamo.disable
def doubled(y):   # dynamo leaves it out of its graphs: eager, between them
    return y * 2


def second_half(z, w2):
    return torch.nn.functional.linear(z, w2).sum()


def broken(x, w1, w2):
    return second_half(doubled(first_half(x, w1)), w2)


def test_a_graph_break_compiles_the_graphs_and_runs_eager_between_them():
    """As torch runs it: two graphs, each saving what torch's partitioner saves for it, and the
    eager multiplication between them. After forward: the first graph's saved tensors, the eager
    product (the second graph saves its input for linear's weight gradient) and the loss; the first
    graph's output is freed once the eager part has read it (gelu's backward needs its input, not
    its output)."""
    rows, d_in, d_mid = TOKENS // 8, HIDDEN // 8, HIDDEN // 2
    first = torch_saved_bytes(first_half, ((rows, d_in), torch.float32, True), ((d_mid, d_in), torch.float32, True))
    second = torch_saved_bytes(second_half, ((rows, d_mid), torch.float32, True), ((d_in, d_mid), torch.float32, True))
    assert first > 0 and second == 0   # the second graph saves only its inputs
    s, _ = predicted(broken, True, mlp_inputs, autocast=False)
    region, = s.compile_regions
    assert region["status"] == "predicted as compiled (inductor) in 2 graphs; eager between them (graph breaks)"
    assert survivors(s, "forward", "backward") == first + rows * d_mid * 4 + 4
    assert not any("runs as eager" in n.what for n in s.notes.items.values())


def breaks_at_item(x, w1, w2):
    y = first_half(x, w1)
    y.amax().item()   # a graph break; on torch's fakes the eager .item() cannot run, on the session's it can
    return second_half(y * 2, w2)


def first_half_and_its_max(x, w1):
    y = first_half(x, w1)
    return y, y.amax()


def test_a_graph_break_at_item_is_run_graph_by_graph():
    """The first graph returns y and its max (which .item() reads): torch's partition saves amax's
    mask too, alive with the graph's backward as long as y's gradient path is."""
    rows, d_in, d_mid = TOKENS // 8, HIDDEN // 8, HIDDEN // 2
    first = torch_saved_bytes(first_half_and_its_max, ((rows, d_in), torch.float32, True),
                              ((d_mid, d_in), torch.float32, True))
    assert first == rows * d_mid * 4 + rows * d_mid   # linear's output for gelu's backward, amax's bool mask
    second = torch_saved_bytes(lambda y, w2: second_half(y * 2, w2), ((rows, d_mid), torch.float32, True),
                               ((d_in, d_mid), torch.float32, True))
    assert second == rows * d_mid * 4   # the product, linear's input, which the graph made itself
    s, _ = predicted(breaks_at_item, True, mlp_inputs, autocast=False)
    region, = s.compile_regions
    assert region["status"].startswith("predicted as compiled (inductor) graph by graph as dynamo runs it"), region
    assert survivors(s, "forward", "backward") == first + second + 4


def test_a_graph_break_gives_every_tensor_its_gradient_and_compiles_each_graph_once(monkeypatch):
    """dynamo's guards pass on the session's tensors at the next calls: no graph is traced again."""
    from amem_alloc.predict.engine.graph_breaks import GraphBreaks

    traced = []
    backend = GraphBreaks._backend
    monkeypatch.setattr(GraphBreaks, "_backend", lambda self, gm, inputs: traced.append(gm) or backend(self, gm, inputs))
    s = FakeCudaSession(**H100)
    with s:
        x, (w1, w2), _ = mlp_inputs()
        step = torch.compile(broken)
        for _ in range(3):
            step(x, w1, w2).backward()
        assert x.grad.shape == x.shape and w1.grad.shape == w1.shape and w2.grad.shape == w2.shape
    assert len(traced) == 2


def test_a_compiled_function_reading_its_weights_from_a_closure_saves_what_torchs_partitioner_saves():
    """The function's weights are not its arguments: dynamo lifts them from the closure, and the
    prediction reads the session's own (their gradients land on them)."""
    want = torch_saved_bytes(mlp, ((TOKENS // 8, HIDDEN // 8), torch.float32, True),
                             ((HIDDEN // 2, HIDDEN // 8), torch.float32, True), ((HIDDEN // 8, HIDDEN // 2), torch.float32, True))
    s = FakeCudaSession(**H100)
    with s:
        x, (w1, w2), _ = mlp_inputs()
        region = torch.compile(lambda x: mlp(x, w1, w2))
        s.marker("forward")
        loss = region(x)
        s.marker("backward")
        loss.backward()
        s.marker("end")
        assert w1.grad.shape == w1.shape and w2.grad.shape == w2.shape and x.grad.shape == x.shape
    region, = s.compile_regions
    assert region["status"].startswith("predicted as compiled (inductor)"), region
    assert region["saved_bytes"] == want
    assert survivors(s, "forward", "backward") == want + 4


def test_a_tensor_read_from_outside_is_read_again_at_each_call_and_not_kept_alive():
    """As dynamo's bytecode reads it at each call (its guard's source): rebinding it to another
    tensor of the same shape needs no new trace, and the first is freed when the program lets go
    of it (the prediction holds no reference)."""
    s = FakeCudaSession(**H100)
    with s:
        x = torch.randn(1024, 1024, device="cuda")
        held = {"t": torch.randn(1024, 1024, device="cuda")}
        scaled = torch.compile(lambda x: (x * held["t"]).sum())
        scaled(x)
        s.marker("rebound")
        held["t"] = torch.randn(1024, 1024, device="cuda")
        scaled(x)
        s.marker("end")
    assert len(s.compile_regions) == 1
    marks = dict((name, i) for i, name in s.markers)
    before = {key for kind, key, size, _ in s.ops[:marks["rebound"]] if kind == ALLOC and size == 1024 * 1024 * 4}
    freed = [key for kind, key, _, _ in s.ops[marks["rebound"]:marks["end"]] if kind != ALLOC and key in before]
    assert len(freed) == 1   # the first tensor (x stays)


def test_module_compile_is_predicted_as_compiled():
    s = FakeCudaSession(**H100)
    with s:
        x, weights, _ = mlp_inputs()
        module = Region(mlp, *weights)
        module.compile()
        module(x).backward()
        module.eval()   # a new training flag: dynamo guards on it, and the region is traced again
        module(x)
    assert [r["region"] for r in s.compile_regions] == ["Region", "Region"]
    assert all(r["status"].startswith("predicted as compiled (inductor)") for r in s.compile_regions)
    # the second trace's note says it is a later call traced again (a region whose calls are
    # predicted differently had two notes at one line that read as contradicting each other)
    from amem_alloc.predict.engine.compiled import TRACED_AGAIN

    said = sorted(n.what for n in s.notes if n.what.startswith("torch.compile region Region"))
    assert said == ["torch.compile region Region: predicted as compiled (inductor)",
                    "torch.compile region Region: predicted as compiled (inductor)" + TRACED_AGAIN], said


def test_a_compiled_function_with_side_effects_runs_eager_and_says_why():
    """dynamo would append the trace's fake to the program's list: the region is refused before it
    runs, and the list gets what eager gives it, the session's own tensor."""
    from amem_alloc.predict.engine.compile_inputs import SIDE_EFFECTS_REASON

    seen = []

    def keeps(x):
        seen.append(x * 2)
        return x.sum()

    s = FakeCudaSession(**H100)
    with s:
        torch.compile(keeps)(torch.randn(64, 64, device="cuda"))
        kept, = seen
        assert kept.device.type == "cuda" and not isinstance(kept, torch._subclasses.FakeTensor)
    region, = s.compile_regions
    assert region["status"] == f"runs as eager: {SIDE_EFFECTS_REASON}"
    assert any(SIDE_EFFECTS_REASON in n.what for n in s.notes.items.values())


def test_a_compiled_function_setting_a_python_flag_is_still_predicted_as_compiled():
    """A side effect that stores no tensor (a flag, as transformers' compile-state context sets) is
    the value eager would store: the region is traced, and the flag is set."""
    class Flags:
        seen = False

    flags = Flags()

    def marks(x):
        flags.seen = True
        return (x * 2).sum()

    s = FakeCudaSession(**H100)
    with s:
        torch.compile(marks)(torch.randn(64, 64, device="cuda"))
    region, = s.compile_regions
    assert region["status"].startswith("predicted as compiled (inductor)"), region
    assert flags.seen is True


def live_between(s, start: str, end: str) -> tuple[int, int]:
    """(highest, last) bytes allocated between two markers and alive, over the ops between them."""
    marks = dict((name, i) for i, name in s.markers)
    live, peak = {}, 0
    for kind, key, size, _ in s.ops[marks[start]:marks[end]]:
        if kind == ALLOC:
            live[key] = size
        else:
            live.pop(key, None)
        peak = max(peak, sum(live.values()))
    return peak, sum(live.values())


def optimizer_step(compiled: bool, foreach=True):
    s = FakeCudaSession(**H100)
    with s:
        params = [torch.nn.Parameter(torch.randn(256, 128, device="cuda")) for _ in range(3)]
        opt = torch.optim.AdamW(params, foreach=foreach)
        for p in params:
            p.grad = torch.randn_like(p)
        step = torch.compile(lambda: opt.step()) if compiled else opt.step
        for i in range(2):
            s.marker(f"step {i}")
            step()
        s.marker("end")
        devices = {t.device.type for p in params for t in opt.state[p].values()}
        groups = [(g["fused"], g["foreach"], g["capturable"]) for g in opt.param_groups]
    return s, groups, devices


def test_a_compiled_optimizer_step_allocates_its_state_and_nothing_else():
    """As inductor's compiled step: AdamW's state made at the first step, on the GPU (capturable, as
    dynamo sets it): exp_avg and exp_avg_sq per parameter, fp32, and one fp32 `step` each; the
    update fused in place, so nothing beyond the state at any point, and nothing at the next step.
    Eager foreach makes parameter-sized temporaries on top (`_foreach_sqrt` and the like)."""
    from amem_alloc.predict.engine.compile_inputs import OPTIMIZER_REASON

    state = 3 * (2 * 256 * 128 * 4 + 4)
    s, groups, devices = optimizer_step(compiled=True)
    assert devices == {"cuda"}
    assert live_between(s, "step 0", "step 1") == (state, state)
    assert live_between(s, "step 1", "end") == (0, 0)
    assert groups == [(None, True, True)]   # the program's own choices kept; capturable, as dynamo leaves it
    region, = s.compile_regions
    assert region["status"] == f"runs as eager: {OPTIMIZER_REASON}"
    eager, _, _ = optimizer_step(compiled=False)
    assert live_between(eager, "step 1", "end")[0] > 0   # its temporaries, which the compiled step has not


def _hand_rolled_adam():
    """An optimizer of the program's own whose step method is compiled in its class and breaks the
    graph before it makes its state (modded-nanogpt's DistAdam waits on collectives there); the
    class is made where the program makes it, while the prediction runs."""
    class HandRolledAdam(torch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {"lr": 1e-3})

        @torch.compile
        @torch.no_grad()
        def step(self):
            for group in self.param_groups:
                for p in group["params"]:
                    torch._dynamo.graph_break()
                    state = self.state[p]
                    if not state:
                        state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg"].mul_(0.9).add_(p.grad, alpha=0.1)
                    p.add_(state["exp_avg"], alpha=-group["lr"])
    return HandRolledAdam


def test_a_step_method_compiled_in_the_optimizers_class_runs_eager_and_is_said():
    """Such a step is refused before it is traced: dynamo stores the state it makes at a graph
    break into the program's optimizer, with the trace's fakes, and the next op mixed those with
    the session's tensors ("Please convert all Tensors to FakeTensors"). It runs eager, its
    temporaries counted, and the output says both."""
    from amem_alloc.predict.engine.compile_inputs import OPTIMIZER_REASON

    s = FakeCudaSession(**H100)
    with s:
        params = [torch.nn.Parameter(torch.randn(256, 128, device="cuda")) for _ in range(2)]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = _hand_rolled_adam()(params)
        opt.step()
        opt.step()
        kinds = {type(t).__name__ for p in params for t in opt.state[p].values()}
    region, = s.compile_regions
    assert region["status"] == f"runs as eager: {OPTIMIZER_REASON}"
    assert kinds == {"Tensor"}   # the session's tensors, none of the trace's
    assert any(n["what"].startswith("HandRolledAdam.step() inside a compiled region") for n in s.notes.as_list())


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


def test_module_compile_with_hooks_of_its_own_runs_them_eager_around_its_compiled_forward():
    """`module.compile()` before hooks are put on the module itself (torchtitan compiles each block,
    then FSDP2's fully_shard adds its all-gather as a forward pre-hook): the hooks run as eager
    around the module's forward, which is predicted as compiled (the region of `forward`). FSDP2's
    hooks are what torch runs that way (dynamo never traces them); hooks of another kind, which
    torch traces into the region, are noted once at the compile() line. The hook runs each call."""
    seen = []
    with FakeCudaSession(**H100) as s:
        plain, hooked = torch.nn.Linear(64, 64).cuda(), torch.nn.Linear(64, 64).cuda()
        plain.compile()
        hooked.compile()
        hooked.register_forward_pre_hook(lambda mod, args: seen.append(args[0].shape))
        x = torch.randn(8, 64, device="cuda")
        plain(x)
        for _ in range(2):
            hooked(x)
        assert "forward" not in hooked.__dict__   # the compiled forward is the module's only while it runs
    notes = [n for n in s.notes.items.values() if n.what.startswith("torch.compile region")]
    eager = [n for n in notes if "own hooks (forward pre hooks) run as eager" in n.what]
    assert len(eager) == 1 and eager[0].count == 1, [(n.what, n.count) for n in notes]
    assert not [n for n in notes if "runs as eager" in n.what], [n.what for n in notes]
    regions = [r for r in s.compile_regions]
    assert [r["status"] for r in regions] == ["predicted as compiled (inductor)"] * 2, regions
    assert seen == [(8, 64)] * 2


def test_fsdp2_hooks_are_told_apart_from_hooks_torch_traces():
    """FSDP2's hooks are dynamo-disabled bound methods of its state (torch.distributed.fsdp's
    `_dynamo_disable` wrapper); a lambda is not."""
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    from amem_alloc.predict.engine import module_hooks

    assert module_hooks.fsdp_hook(FSDPState()._pre_forward)
    assert not module_hooks.fsdp_hook(lambda mod, args: None)


def test_torch_compile_of_a_module_is_torchs_optimized_module():
    """torch.compile(module) gives torch's own OptimizedModule under prediction too (Lightning and
    others check for it): the module as `_orig_mod`, its state_dict keys prefixed as torch's are,
    its attributes the module's; calls run its compiled region, and its `dynamo_ctx` compiles
    what it is given (Lightning compiles a module's `forward` and `training_step` with it). An
    eager backend gives an OptimizedModule whose calls are the module's own. Its warning about
    global module hooks is not shown: the session's module tracking is the hook."""
    import warnings

    from torch._dynamo.eval_frame import OptimizedModule

    s = FakeCudaSession(**H100)
    with s:
        m = torch.nn.Linear(64, 64).cuda()
        c = torch.compile(m)
        assert isinstance(c, OptimizedModule) and c._orig_mod is m and c.weight is m.weight
        assert list(c.state_dict()) == ["_orig_mod.weight", "_orig_mod.bias"]
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always", append=True)   # after the session's own filters
            c(torch.randn(32, 64, device="cuda", requires_grad=True)).sum().backward()
        assert not [w for w in warned if "global hooks" in str(w.message)]   # the hooks are amem's own
        forward = c.dynamo_ctx(m.forward)
        forward(torch.randn(16, 64, device="cuda"))
        eager = torch.compile(m, backend="eager")
        assert isinstance(eager, OptimizedModule) and eager._orig_mod is m
        eager(torch.randn(8, 64, device="cuda"))
    statuses = [(r["region"], r["status"]) for r in s.compile_regions]
    assert statuses == [("Linear", "predicted as compiled (inductor)")] * 2, statuses


class KVCache:
    """A cache object a compiled step updates in place and hands back (transformers' StaticCache
    passed as `past_key_values` and returned in the model's output)."""

    def __init__(self, rows: int):
        self.keys = torch.zeros(rows, 64, device="cuda")


def cached_step(x, cache):
    cache.keys.add_(x)
    return x * 2, cache


def test_a_compiled_step_handing_back_its_cache_argument_is_compiled_and_returns_this_calls_cache():
    """The result holds an object the call was given (not one the trace made): the region is
    predicted as compiled, and each call gets its own argument back, the plan being shared."""
    with FakeCudaSession(**H100) as s:
        step = torch.compile(cached_step)
        x = torch.randn(8, 64, device="cuda")
        first, second = KVCache(8), KVCache(8)
        out, got = step(x, first)
        assert got is first and out.shape == (8, 64)
        out, got = step(x, second)
        assert got is second
    region, = s.compile_regions   # one trace: the second call's inputs have the first's shapes
    assert region["status"].startswith("predicted as compiled (inductor)"), region


def torchs_own_nested_compile() -> tuple[int, int]:
    """Graphs torch compiles for `torch.compile(model.__call__)` over a module whose forward is
    itself compiled, on the CPU: (outer's, inner's)."""
    counts = {"outer": 0, "inner": 0}

    def counting(name):
        def backend(gm, example_inputs):
            counts[name] += 1
            return gm.forward
        return backend

    torch._dynamo.reset()
    model = torch.nn.Linear(64, 64)
    model.forward = torch.compile(model.forward, backend=counting("inner"))
    torch.compile(model.__call__, backend=counting("outer"))(torch.randn(8, 64))
    torch._dynamo.reset()
    return counts["outer"], counts["inner"]


def test_a_compiled_call_over_a_compiled_forward_compiles_what_torch_compiles(capfd):
    """torch compiles nothing of the outer region (its frames are torch's module code, which dynamo
    skips) and compiles the inner forward on its own. The prediction does the same: dynamo is never
    offered amem's own frames (the inner region's wrapper, inductor's replayed wrapper), which it
    traced before, printing its warnings about amem's code and splitting the outer in 6 graphs."""
    assert torchs_own_nested_compile() == (0, 1)
    with FakeCudaSession(**H100) as s:
        model = torch.nn.Linear(64, 64).cuda()
        model.forward = torch.compile(model.forward)
        outer = torch.compile(model.__call__)
        with torch.no_grad():
            for _ in range(2):
                outer(torch.randn(8, 64, device="cuda"))
    inner, outer = s.compile_regions
    assert inner["status"] == "predicted as compiled (inductor)" and len(inner["graphs"]) == 1, inner
    assert outer["status"] == "runs as eager: nothing for inductor to compile", outer
    assert "Dynamo does not know how to trace" not in capfd.readouterr().err


def test_what_a_failed_trace_printed_is_not_shown(capsys):
    """FSDP1 prints the whole stack before its assertion fails on the trace's tensors
    (torch.distributed.utils._p_assert): four screenfuls for regions that then ran as eager, said in
    a note. What a trace that fails writes to stderr is dropped; the region runs as eager."""
    import sys
    import traceback

    def checks(x):
        if x.data_ptr() == 0:   # the trace's own tensors have no data; the session's have an address
            traceback.print_stack(file=sys.stderr)
            raise AssertionError("Expects tensor to be on the compute device")
        return x * 2

    s = FakeCudaSession(**H100)
    with s:
        torch.compile(checks)(torch.randn(64, 64, device="cuda"))
    region, = s.compile_regions
    assert region["status"].startswith("runs as eager"), region["status"]
    assert "print_stack" not in capsys.readouterr().err
