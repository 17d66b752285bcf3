"""CUDA's kernels as CUDA runs them (amem_alloc/predict/rules/): fused and foreach optimizers,
GradScaler, cuDNN batch norm, cross-entropy under autocast, embedding backward, cuDNN convolution.
Byte counts are worked out here from the model's shapes and torch's sources (named per test)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from amem_alloc.predict.engine.session import FakeCudaSession  # noqa: E402
from amem_alloc.replay import ALLOC  # noqa: E402

A100 = dict(capability=(8, 0), device_name="NVIDIA A100-SXM4-80GB")


def events(s, start, end=None):
    """[("alloc", op, bytes, key) | ("free", key)] between two markers."""
    marks = dict((name, i) for i, name in s.markers)
    out = []
    for kind, key, size, _ in s.ops[marks[start]:marks[end] if end else len(s.ops)]:
        out.append(("alloc", s.infos[key].op, size, key) if kind == ALLOC else ("free", key))
    return out


def allocs(s, start, end=None):
    return [(op, size) for kind, op, size, _ in (e for e in events(s, start, end) if e[0] == "alloc")]


def peak_extra(s, start, end):
    """The most bytes allocated at once between two markers beyond what was live at `start`."""
    live = top = 0
    sizes = {}
    for e in events(s, start, end):
        if e[0] == "alloc":
            sizes[e[3]] = e[2]
            live += e[2]
            top = max(top, live)
        elif e[1] in sizes:
            live -= sizes.pop(e[1])
    return top


# ============================================================================ optimizers
W, BIAS = 64 * 64 * 4, 64 * 4      # a Linear(64, 64)'s weight and bias, float32


def _trained(optimizer, **kw):
    s = FakeCudaSession(**A100)
    with s:
        model = torch.nn.Linear(64, 64).cuda()
        opt = getattr(torch.optim, optimizer)(model.parameters(), **kw)
        for step in ("first", "second"):
            model(torch.randn(8, 64, device="cuda")).sum().backward()
            s.marker(step)
            opt.step()
            s.marker(f"{step} done")
    return s


def _fused_adagrad_on_cuda() -> bool:
    """torch 2.11's Adagrad refuses fused=True for CUDA parameters (adagrad.py checks them with
    cuda_unsupported=True), as it would on a GPU; later releases run fused_adagrad on CUDA."""
    import importlib
    import inspect

    return "cuda_unsupported=True" not in inspect.getsource(importlib.import_module("torch.optim.adagrad"))


@pytest.mark.parametrize("optimizer, kw", [("Adam", {}), ("AdamW", {}), ("SGD", dict(lr=0.1, momentum=0.9)),
                                           pytest.param("Adagrad", {}, marks=pytest.mark.skipif(
                                               not _fused_adagrad_on_cuda(),
                                               reason="this torch has no fused Adagrad for CUDA"))])
def test_fused_optimizers_run_and_allocate_only_their_state(optimizer, kw):
    """fused_adam*.cu, FusedSgdKernel.cu, fused_adagrad*.cu update in place through
    multi_tensor_apply, whose tensor lists travel as kernel arguments: no device memory of their own.
    The first step makes the state (fused: the step counters are float32 scalars on the GPU)."""
    s = _trained(optimizer, fused=True, **kw)
    first = sorted(allocs(s, "first", "first done"))
    expected = {"Adam": [4, 4, BIAS, BIAS, W, W], "AdamW": [4, 4, BIAS, BIAS, W, W],   # step, exp_avg, exp_avg_sq
                "SGD": [BIAS, W],                                                    # momentum buffers
                "Adagrad": []}[optimizer]             # Adagrad makes its state in __init__
    assert sorted(size for _, size in first) == sorted(expected)
    assert allocs(s, "second", "second done") == []


def test_foreach_adam_step_peak_is_the_sqrt_intermediate_of_multi_tensor_adam():
    """torch/optim/adam.py _multi_tensor_adam (no weight decay, not capturable): the only
    intermediate is exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs), one tensor per parameter, all
    alive until addcdiv_; the step counters stay on the CPU."""
    s = _trained("Adam", foreach=True)
    assert sorted(allocs(s, "second", "second done")) == sorted([("_foreach_sqrt.default", W),
                                                                 ("_foreach_sqrt.default", BIAS)])
    assert peak_extra(s, "second", "second done") == W + BIAS


def test_foreach_adam_weight_decay_adds_a_gradient_copy_freed_before_the_sqrt():
    s = _trained("Adam", foreach=True, weight_decay=0.1)   # device_grads = _foreach_add(grads, params)
    ops = allocs(s, "second", "second done")
    assert sorted(size for op, size in ops if op == "_foreach_add.List") == [BIAS, W]
    assert peak_extra(s, "second", "second done") == W + BIAS   # the copy dies (del) before the sqrt


def test_grad_scaler_tensors_are_device_allocations_and_its_ops_run_in_place():
    """torch/amp/grad_scaler.py: scale and growth tracker (float32 / int32 scalars), per step a
    found_inf and a unit inv_scale, each copied by _MultiDeviceReplicator (copy=True);
    _amp_foreach_non_finite_check_and_unscale_ and _amp_update_scale_ allocate nothing."""
    s = FakeCudaSession(**A100)
    with s:
        model = torch.nn.Linear(64, 64).cuda()
        opt = torch.optim.AdamW(model.parameters(), fused=True)
        scaler = torch.amp.GradScaler("cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(torch.randn(8, 64, device="cuda")).float().sum()
        s.marker("scale")
        scaled = scaler.scale(loss)
        scaled.backward()
        s.marker("step")
        scaler.step(opt)
        s.marker("update")
        scaler.update()
        s.marker("end")
    assert allocs(s, "scale", "step")[:3] == [("full.default", 4), ("full.default", 4), ("mul.Tensor", 4)]
    step = allocs(s, "step", "update")
    assert step[:4] == [("full.default", 4), ("full.default", 4), ("_to_copy.default", 4), ("_to_copy.default", 4)]
    assert allocs(s, "update", "end") == []


def test_missing_meta_kernels_are_registered_only_where_torch_has_none_and_only_while_a_session_runs():
    from amem_alloc.predict.rules import meta_kernels
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    names = [n for n in meta_kernels.IN_PLACE + meta_kernels.RETURNS_SELF + meta_kernels.LIKE_LOG_PROBS + meta_kernels.NOT_NESTED
             + meta_kernels.OUT_OF_DEFAULT + tuple(meta_kernels.SYNC_BN)
             if meta_kernels._exists(n)]
    before = {n: has(f"aten::{n}", "Meta") for n in names}
    s = FakeCudaSession(**A100)
    with s:
        for name in names:
            assert has(f"aten::{name}", "Meta"), name
        registered = list(s.meta_kernels.registered)
    assert registered == [n for n in names if not before[n]]
    assert {n: has(f"aten::{n}", "Meta") for n in names} == before   # torch is as it was
    if hasattr(torch._meta_registrations, "meta__fused_adam_"):   # torch's own Meta kernel is kept
        assert "_fused_adam_" not in registered


# ============================================================================ batch norm
N, C, HW = 4, 16, 8


def test_sync_batch_norms_ops_allocate_what_their_cuda_kernels_return():
    """SyncBatchNorm's ops had no Meta kernel: timm's --sync-bn stopped ("cannot model ...
    batch_norm_stats"). Each allocates what Normalization.cu returns: [C] statistics in the
    accumulate type (float for half input), outputs like the input (2 ranks' statistics gathered)."""
    s = FakeCudaSession(**A100)
    with s:
        x = torch.randn(N, C, HW, HW, device="cuda", dtype=torch.float16)
        weight, bias = torch.ones(C, device="cuda"), torch.zeros(C, device="cuda")
        s.marker("sync")
        mean, invstd = torch.batch_norm_stats(x, 1e-5)
        gathered = torch.stack([mean, mean]), torch.stack([invstd, invstd])
        counts = torch.full((2,), float(N * HW * HW), device="cuda")
        mean, invstd = torch.batch_norm_gather_stats_with_counts(x, *gathered, None, None, 0.1, 1e-5, counts)
        y = torch.batch_norm_elemt(x, weight, bias, mean, invstd, 1e-5)
        sum_dy, sum_dy_xmu, grad_w, grad_b = torch.batch_norm_backward_reduce(y, x, mean, invstd, weight, True, True, True)
        grad_x = torch.batch_norm_backward_elemt(y, x, mean, invstd, weight, sum_dy, sum_dy_xmu, counts.int())
        s.marker("end")
        seen = [(t.dtype, tuple(t.shape)) for t in (mean, y, sum_dy, grad_w, grad_x)]
    assert seen == [(torch.float32, (C,)), (torch.float16, (N, C, HW, HW)), (torch.float32, (C,)),
                    (torch.float32, (C,)), (torch.float16, (N, C, HW, HW))]
    made = [(op.split(".")[0], size) for op, size in allocs(s, "sync", "end") if op.startswith("batch_norm")]
    stats, image = C * 4, N * C * HW * HW * 2
    assert made == [("batch_norm_stats", stats)] * 2 + [("batch_norm_gather_stats_with_counts", stats)] * 2 + [
        ("batch_norm_elemt", image)] + [("batch_norm_backward_reduce", stats)] * 4 + [("batch_norm_backward_elemt", image)]


def _bn(dtype, weight_dtype=torch.float32, training=True, layout=None, dim=4, cudnn=True):
    s = FakeCudaSession(**A100)
    with s, torch.backends.cudnn.flags(enabled=cudnn):
        bn = torch.nn.BatchNorm2d(C) if dim == 4 else torch.nn.BatchNorm1d(C)
        bn = bn.cuda().to(weight_dtype).train(training)
        shape = (N, C, HW, HW) if dim == 4 else (N, C)
        x = torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=True)
        if layout == "channels_last":
            x = x.detach().to(memory_format=torch.channels_last).requires_grad_()
        if layout == "transposed":
            x = x.detach().transpose(2, 3).requires_grad_()
        s.marker("forward")
        y = bn(x)
        s.marker("backward")
        if training:
            y.backward(torch.ones_like(y))
        s.marker("end")
    return s


def test_batch_norm_takes_cudnn_for_fp16_input_with_fp32_weight_and_saves_what_it_returns():
    """Normalization.cpp _select_batch_norm_backend: fp16 input with an fp32 weight, 4-D, training.
    cudnn_batch_norm returns output, save_mean, save_var [C] f32 and a reserve (0 bytes here)."""
    s = _bn(torch.float16)
    fwd = allocs(s, "forward", "backward")
    assert sorted(size for op, size in fwd if op == "cudnn_batch_norm.default") == sorted([N * C * HW * HW * 2, C * 4, C * 4])
    bwd = allocs(s, "backward", "end")
    assert sorted(size for op, size in bwd if op == "cudnn_batch_norm_backward.default") == sorted(
        [N * C * HW * HW * 2, C * 4, C * 4])     # grad_input, grad_weight, grad_bias
    assert not any(op.startswith("native_batch_norm") for op, _ in fwd + bwd)


@pytest.mark.parametrize("case, kwargs", [
    ("bfloat16 input", dict(dtype=torch.bfloat16)),
    ("fp16 weight", dict(dtype=torch.float16, weight_dtype=torch.float16)),
    ("2-D input", dict(dtype=torch.float32, dim=2)),
    ("cuDNN disabled", dict(dtype=torch.float32, cudnn=False)),
])
def test_batch_norm_stays_native_where_cudnn_is_not_taken(case, kwargs):
    s = _bn(**kwargs)
    ops = {op for op, _ in allocs(s, "forward", "end")}
    assert "native_batch_norm.default" in ops and "cudnn_batch_norm.default" not in ops


def test_cudnn_batch_norm_in_eval_returns_empty_stats_and_copies_a_non_contiguous_input():
    s = _bn(torch.float32, training=False, layout="transposed")
    fwd = allocs(s, "forward", "backward")
    assert ("clone.default", N * C * HW * HW * 4) in fwd          # input.contiguous(suggest_memory_format())
    assert sorted(size for op, size in fwd if op == "cudnn_batch_norm.default") == [N * C * HW * HW * 4]


def test_cudnn_batch_norm_keeps_channels_last_without_a_copy():
    s = _bn(torch.float16, layout="channels_last")
    assert not any(op == "clone.default" for op, _ in allocs(s, "forward", "backward"))


# ============================================================================ cross-entropy
NT, V = 32, 1000     # tokens, classes


def _ce(autocast=True, **kw):
    s = FakeCudaSession(**A100)
    with s:
        head = torch.nn.Linear(64, V).cuda()
        x, target = torch.randn(NT, 64, device="cuda"), torch.randint(0, V, (NT,), device="cuda")
        with torch.autocast("cuda", dtype=torch.float16, enabled=autocast):
            logits = head(x)
            s.marker("loss")
            loss = F.cross_entropy(logits, target, **kw)
        s.marker("backward")
        loss.backward()
        s.marker("end")
    return s, loss


def test_cross_entropy_under_autocast_keeps_fp16_log_probs_and_their_fp32_copy():
    """LossNLL.cpp: log_softmax(x, 1, x.scalar_type()) keeps fp16 (autocast keeps an explicit
    dtype); nll_loss is on autocast's fp32 list, so the log-probabilities are copied to fp32."""
    s, loss = _ce()
    ops = allocs(s, "loss", "backward")
    assert ops[:2] == [("_log_softmax.default", NT * V * 2), ("_to_copy.default", NT * V * 4)]
    assert sorted(size for op, size in ops if op == "nll_loss_forward.default") == [4, 4]   # loss, total_weight
    assert loss.dtype == torch.float32


def test_cross_entropy_label_smoothing_sums_the_fp16_log_probs_in_fp32():
    s, _ = _ce(label_smoothing=0.1)
    ops = allocs(s, "loss", "backward")
    assert ("_log_softmax.default", NT * V * 2) in ops
    assert ("sum.dim_IntList", NT * 4) in ops        # -logp.sum(1): sum is fp32_set_opt_dtype
    assert ("eq.Scalar", NT) in ops                   # target == ignore_index


def test_cross_entropy_without_autocast_is_torch_own_composite():
    s, _ = _ce(autocast=False)
    ops = allocs(s, "loss", "backward")
    assert ops[0] == ("_log_softmax.default", NT * V * 4) and ("_to_copy.default", NT * V * 4) not in ops


# ============================================================================ embedding backward
VOCAB, DIM = 1000, 64


def _embedding(tokens, dtype=torch.float32, scale=False):
    s = FakeCudaSession(**A100)
    with s:
        emb = torch.nn.Embedding(VOCAB, DIM, scale_grad_by_freq=scale).cuda().to(dtype)
        idx = torch.randint(0, VOCAB, tokens, device="cuda")
        out = emb(idx)
        s.marker("backward")
        out.backward(torch.ones_like(out))
        s.marker("end")
    return s


def _temporaries(s):
    return {op.split(":", 1)[1]: size for op, size in allocs(s, "backward", "end")
            if op.startswith("embedding_dense_backward:")}


def test_embedding_backward_sorts_indices_and_accumulates_segments_as_embedding_cu_does():
    """Embedding.cu embedding_dense_backward_cuda (n > 3072: the sort path) and
    EmbeddingBackwardKernel.cu: int64 index buffers of n elements, and grad_weight_per_segment
    [n, D] in the gradient's accumulation type."""
    n = 8 * 512
    s = _embedding((8, 512))
    tmp = _temporaries(s)
    for name in ("sorted_indices", "orig_indices", "range", "segment_offsets", "partials_per_segment",
                 "partials_per_segment_offset", "partial_segment_offset"):
        assert tmp[name] == n * 8, name
    assert tmp["num_of_segments"] == tmp["num_of_partial_segments"] == 8
    assert tmp["grad_weight_per_segment"] == n * DIM * 4
    assert ("embedding_dense_backward.default", VOCAB * DIM * 4) in allocs(s, "backward", "end")
    # while grad_weight_per_segment exists, so do the sorted buffers and segment tables (range and
    # the sort's storage are gone): the op's peak beyond what was live before it
    held = sum(tmp[k] for k in ("sorted_indices", "orig_indices", "segment_offsets", "num_of_segments",
                                "partials_per_segment", "partials_per_segment_offset", "num_of_partial_segments",
                                "partial_segment_offset", "grad_weight_per_segment"))
    grad_output = n * DIM * 4                               # the ones_like passed to backward
    assert peak_extra(s, "backward", "end") == grad_output + held + VOCAB * DIM * 4


def test_embedding_backward_of_few_indices_takes_no_temporaries():
    assert _temporaries(_embedding((4, 256))) == {}       # 1024 <= 3072: one kernel over the rows


def test_embedding_backward_accumulates_half_gradients_in_float32():
    assert _temporaries(_embedding((8, 512), dtype=torch.float16))["grad_weight_per_segment"] == 8 * 512 * DIM * 4


def test_embedding_backward_scaled_by_frequency_counts_indices():
    tmp = _temporaries(_embedding((4, 256), scale=True))   # scale_grad_by_freq always sorts
    assert tmp["count"] == 4 * 256 * 8


# ============================================================================ cuDNN convolution
def _conv(dtype, channels_last=False, capability=(8, 0), tf32=True):
    s = FakeCudaSession(capability=capability, device_name="NVIDIA A100-SXM4-80GB")
    with s, torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
        conv = torch.nn.Conv2d(16, 32, 3, padding=1).cuda().to(dtype)
        x = torch.randn(4, 16, 20, 20, device="cuda", dtype=dtype, requires_grad=True)
        if channels_last:
            conv = conv.to(memory_format=torch.channels_last)
            x = x.detach().to(memory_format=torch.channels_last).requires_grad_()
        s.marker("forward")
        y = conv(x)
        s.marker("backward")
        y.backward(torch.ones_like(y))
        s.marker("end")
    return s


X, Y, WT = 4 * 16 * 20 * 20, 4 * 32 * 20 * 20, 32 * 16 * 3 * 3    # elements of x, y and the weight


def _workspaces(s):
    return [(op.split(", ")[1], size) for op, size in allocs(s, "forward", "end") if "workspace" in op]


def test_cudnn_convolution_workspace_is_the_nhwc_transposition_estimate_and_a_note():
    """convolution.py's stated rule: a channels-first tensor-core conv is given its tensors' bytes
    (forward x + y + w, backward data dy + dx + w, backward filter x + dy + w)."""
    s = _conv(torch.float16)
    assert _workspaces(s) == [("forward", (X + Y + WT) * 2), ("backward data", (Y + X + WT) * 2),
                              ("backward filter", (X + Y + WT) * 2)]
    assert {n.what.split(" (")[0] for n in s.notes} >= {"cuDNN convolution workspace, forward",
                                                      "cuDNN convolution workspace, backward filter"}
    assert all(n.kind == "estimate" for n in s.notes if "convolution" in n.what)


def test_cudnn_convolution_workspace_is_freed_with_each_call():
    s = _conv(torch.float16)
    frees = {e[1] for e in events(s, "forward") if e[0] == "free"}
    assert all(e[3] in frees for e in events(s, "forward") if e[0] == "alloc" and "workspace" in e[1])


@pytest.mark.parametrize("case, kwargs", [
    ("channels-last", dict(dtype=torch.float16, channels_last=True)),
    ("fp32 without TF32", dict(dtype=torch.float32, tf32=False)),
    ("fp32 on a V100", dict(dtype=torch.float32, capability=(7, 0))),
])
def test_no_workspace_estimate_where_no_transposition_is_needed(case, kwargs):
    assert all(size == 0 for _, size in _workspaces(_conv(**kwargs)))


def test_convolution_backward_copies_a_non_contiguous_grad_output():
    s = FakeCudaSession(**A100)
    with s:
        conv = torch.nn.Conv2d(16, 32, 3, padding=1).cuda()
        y = conv(torch.randn(4, 16, 20, 20, device="cuda"))
        grad = torch.ones(4, 32, 20, 20, device="cuda").transpose(2, 3)
        s.marker("backward")
        y.backward(grad)
        s.marker("end")
    assert ("convolution_backward:grad_output.contiguous", Y * 4) in allocs(s, "backward", "end")


# ============================================================================ foreach
def test_clip_grad_norm_with_foreach_takes_cudas_branch_and_its_partial_results():
    """torch's C++ grouping filed fake CUDA gradients under meta and clip_grad_norm_(foreach=True)
    refused them ("can't use the foreach API on meta tensors"); grouped under the device they claim,
    the foreach norm runs, and _foreach_norm takes what ForeachReduceOp.cu allocates around its
    outputs: one fp32 partial result per 65536-element chunk of the largest tensor, per tensor, and
    320 fp32 of global output and a 0-dim global norm, all freed when it returns."""
    s = FakeCudaSession(**A100)
    with s:
        model = torch.nn.Sequential(torch.nn.Linear(512, 300), torch.nn.Linear(300, 8)).cuda()
        model(torch.randn(4, 512, device="cuda")).sum().backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        assert norm.is_cuda
        grouped = torch.utils._foreach_utils._group_tensors_by_device_and_dtype([[p.grad for p in model.parameters()]])
        assert [key[0].type for key in grouped] == ["cuda"]
    temps = {s.infos[k].op: size for kind, k, size, _ in s.ops if kind == ALLOC and ":" in (s.infos[k].op or "")}
    chunks = -(-512 * 300 // 65536)   # the largest gradient, 153,600 elements: 3 chunks
    assert temps == {"_foreach_norm:output_per_tensor": 4 * chunks * 4, "_foreach_norm:global_output": 320 * 4,
                     "_foreach_norm:global_norm": 4}


@pytest.mark.parametrize("lengths", ["tensors", "lists"])
def test_ctc_loss_backward_returns_the_log_probs_gradient_and_takes_log_beta(lengths):
    """LossCTC.cu's backward: torch ships no Meta kernel for `_ctc_loss_backward` (the script
    stopped, "cannot model NotImplementedError"); it returns the gradient, contiguous like the
    log-probabilities, after `log_beta` (like `log_alpha`: batch x T x (2 S + 1)) and the batch's
    lengths and offsets (int64) on the device. The forward's two outputs (its loss per sequence
    and `log_alpha`) are allocations too."""
    steps, batch, classes, longest = 50, 4, 20, 30
    with FakeCudaSession() as s:
        log_probs = torch.randn(steps, batch, classes, device="cuda").log_softmax(2).detach().requires_grad_()
        targets = torch.randint(1, classes, (batch, longest), device="cuda")
        s.marker("forward")
        if lengths == "tensors":
            loss = F.ctc_loss(log_probs, targets, torch.full((batch,), steps), torch.full((batch,), longest))
        else:
            loss = F.ctc_loss(log_probs, targets, [steps] * batch, [longest] * batch)
        s.marker("backward")
        loss.backward()
        assert log_probs.grad.shape == (steps, batch, classes)
    ops = allocs(s, "backward")
    alpha = batch * steps * (2 * longest + 1) * 4
    forward = [size for op, size in allocs(s, "forward", "backward") if op.startswith("_ctc_loss.")]
    assert forward == [batch * 4, alpha]   # (a data-dependent size's outputs were not recorded at all)
    taken = [(op, size) for op, size in ops if op.startswith("_ctc_loss_backward:")]
    assert taken == [("_ctc_loss_backward:log_beta", alpha)] + [
        (f"_ctc_loss_backward:{what}", 8 * batch) for what in ("target lengths", "input lengths", "batch offsets")]
    assert ("_ctc_loss_backward.Tensor" if lengths == "tensors" else "_ctc_loss_backward.default",
            steps * batch * classes * 4) in ops


def test_a_transformer_encoder_with_a_padding_mask_in_inference_runs_its_padded_path():
    """nn.TransformerEncoder in inference with a padding mask asks whether the mask is left-aligned
    (to drop the padding into a nested tensor): no Meta kernel, and the script stopped. The answer
    is no, and the padded path runs, said where the figures are."""
    from amem_alloc.predict.rules import meta_kernels

    with FakeCudaSession() as s:
        layer = torch.nn.TransformerEncoderLayer(64, 8, batch_first=True)
        encoder = torch.nn.TransformerEncoder(layer, 2).cuda().eval()
        x = torch.randn(4, 16, 64, device="cuda")
        with torch.inference_mode():
            out = encoder(x, src_key_padding_mask=torch.zeros(4, 16, dtype=torch.bool, device="cuda"))
        assert out.shape == (4, 16, 64) and not out.is_nested
    assert [n.what for n in s.notes if n.kind == "not-modelled"] == [meta_kernels.NESTED_NOTE]


def test_scaled_mm_into_an_output_buffer_takes_what_the_default_form_takes():
    """inductor's code for torchao's float8 training calls `_scaled_mm.out` with a buffer of its own;
    torch has a Meta kernel for `_scaled_mm` only ("cannot model NotImplementedError:
    aten::_scaled_mm.out ..."). The out= form writes the default's result shape into the buffer:
    the same memory as the default form, which makes that buffer itself."""
    import amem_alloc

    def program(into_buffer: bool):
        a = torch.empty(256, 512, device="cuda").to(torch.float8_e4m3fn)
        b = torch.empty(1024, 512, device="cuda").to(torch.float8_e4m3fn).t()
        one = torch.ones((), device="cuda")
        if into_buffer:
            out = torch.empty(256, 1024, device="cuda", dtype=torch.bfloat16)
            got = torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16, out=out)
            assert got is out
        else:
            got = torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)
        assert got.shape == (256, 1024) and got.dtype == torch.bfloat16

    peaks = [amem_alloc.predict(program, into, gpu="H100").row("torch").peak_allocated for into in (True, False)]
    assert peaks[0] == peaks[1] > 0
