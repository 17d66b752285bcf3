"""The prediction engine (amem_alloc/predict/engine/session.py): fake CUDA tensors, torch's own autograd,
and the allocation sequence CUDA's caching allocator would receive, checked against numbers worked
out by hand from the model's shapes."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from amem_alloc.predict.engine.session import DataDependentError, FakeCudaSession  # noqa: E402
from amem_alloc.replay import ALLOC  # noqa: E402

B, S, D, H = 2, 20, 64, 4          # batch, sequence, width, heads (head dim 16): no two sizes collide
MiB = 1 << 20


class Listener:
    def __init__(self):
        self.events = []

    def on_alloc(self, key, stream, info):
        self.events.append(("alloc", key, info.requested))

    def on_free(self, key):
        self.events.append(("free", key))

    def on_marker(self, name):
        self.events.append(("marker", name))


def live_at(session, marker):
    """{key: requested} of CUDA storages alive when `marker` was recorded."""
    end = next(i for i, name in session.markers if name == marker)
    live = {}
    for kind, key, size, _ in session.ops[:end]:
        if kind == ALLOC:
            live[key] = size
        else:
            live.pop(key, None)
    return live


def by_category(session, live):
    out = {}
    for key, size in live.items():
        cat = session.infos[key].category
        out[cat] = out.get(cat, 0) + size
    return out


# ============================================================================ basics
def test_tensors_say_cuda_and_allocations_are_requested_bytes():
    with FakeCudaSession() as s:
        x = torch.empty(1000, 3, device="cuda")
        assert x.device == torch.device("cuda", 0) and x.is_cuda
        v = x.view(3000)            # a view shares the storage: no allocation
        y = x.to(torch.float16)
        del x, v
    allocs = [(size, s.infos[key].op) for kind, key, size, _ in s.ops if kind == ALLOC]
    assert allocs == [(12000, "empty.memory_format"), (6000, "_to_copy.default")]
    frees = [key for kind, key, _, _ in s.ops if kind != ALLOC]
    assert len(frees) == 1          # x died with its view; y is alive at the end
    assert y.dtype == torch.float16


def test_a_factory_outside_torchs_list_of_them_makes_a_fake_cuda_tensor():
    """torch.normal(mean, std, size, device=) (Opacus' noise) is no function torch lists as a
    device constructor: it reached torch's CUDA with no driver, "cannot model" (exit 4). A torch
    function given a device and no tensor makes its tensor there."""
    with FakeCudaSession() as s:
        noise = torch.normal(mean=0, std=1.0, size=(16, 1, 8, 8), device="cuda", dtype=torch.float32)
        assert noise.is_cuda and noise.shape == (16, 1, 8, 8)
    assert [(size, s.infos[key].op) for kind, key, size, _ in s.ops if kind == ALLOC] == [(4096, "normal.float_float")]


def test_cpu_tensors_are_fake_too_and_moving_them_allocates_on_cuda():
    with FakeCudaSession() as s:
        big = torch.empty(1 << 30, dtype=torch.uint8)     # 1 GiB on the "CPU": nothing real
        assert big.device.type == "cpu"
        small = torch.ones(10, 10)
        on_gpu = small.cuda()
        assert on_gpu.is_cuda and not small.is_cuda
    assert [size for kind, _, size, _ in s.ops if kind == ALLOC] == [400]


def test_pinned_copies_answer_is_pinned_as_torch_does():
    """pin_memory makes an ordinary copy here; is_pinned answers for it and its views, and for
    nothing else (a pinned tensor of many elements failed: the lookup compared tensors by ==)."""
    with FakeCudaSession():
        host = torch.randn(1000)
        pinned = host.pin_memory()
        assert pinned.is_pinned() and pinned[10:].is_pinned()
        assert not host.is_pinned() and not torch.empty(1000).is_pinned()
        assert not pinned.cuda(non_blocking=True).is_pinned()
        assert torch.equal(pinned, host)
        made = torch.empty(1000, pin_memory=True)
        assert made.is_pinned() and not torch.empty(1000).is_pinned()


def test_fake_tensors_have_distinct_addresses_as_real_ones_do():
    """data_ptr() of fake tensors (meta underneath, where it is 0 for all): distinct per live
    storage, a view's is its storage's plus its offset, the storage's own data_ptr() agrees, and a
    fake CPU parameter has one too (accelerate maps an optimizer's parameters to their FSDP shards
    by data_ptr: with 0 for all, every parameter mapped to one)."""
    with FakeCudaSession() as s:
        a, b = torch.empty(100, device="cuda"), torch.empty(100, device="cuda")
        weight, bias = torch.nn.Linear(4, 4).parameters()   # fake CPU parameters
        pointers = [a.data_ptr(), b.data_ptr(), weight.data_ptr(), bias.data_ptr()]
        assert 0 not in pointers and len(set(pointers)) == 4
        assert a[10:].data_ptr() == a.data_ptr() + 10 * 4
        assert a.untyped_storage().data_ptr() == a.data_ptr() and a.view(10, 10).data_ptr() == a.data_ptr()
        assert abs(a.data_ptr() - b.data_ptr()) >= 400   # blocks do not overlap
        held = len(s.storages.addresses)
        before = a.data_ptr()
        a.untyped_storage().resize_(0)   # FSDP frees and refills a storage so: a new block
        a.untyped_storage().resize_(400)
        assert a.data_ptr() != before and len(s.storages.addresses) == held   # the old block's address let go
    assert torch.empty(3, device="meta").data_ptr() == 0   # restored after the session


def test_listeners_hear_every_alloc_free_and_marker_in_order():
    lst = Listener()
    s = FakeCudaSession()
    s.add_listener(lst)
    with s:
        a = torch.zeros(256, device="cuda")
        s.marker("step")
        del a
    assert lst.events[0][0] == "alloc" and lst.events[0][2] == 1024
    assert lst.events[1] == ("marker", "step")
    assert lst.events[2] == ("free", lst.events[0][1])


@pytest.mark.parametrize("code", ["loss.item()", "print(loss)", "bool(loss > 0)", "float(loss)",
                                  "loss.cpu().numpy()", "f'{loss:.3f}'", "torch.equal(loss, loss)",
                                  "torch.allclose(loss, loss)"])
def test_strict_value_reads_raise_naming_the_users_line(code):
    with FakeCudaSession(strict=True):
        loss = torch.randn(3, device="cuda").sum()   # random: its value is not known (known.py)
        with pytest.raises(DataDependentError) as err:
            exec(compile(code, __file__, "exec"), {"loss": loss, "torch": torch})
    assert f"{__file__}:1" in str(err.value)
    assert err.value.filename == __file__ and err.value.lineno == 1


def test_strict_leaves_torchs_own_grad_scaler_check_its_stand_in():
    """GradScaler reads whether the gradients hold an inf inside torch (grad_scaler.py), which no
    script can take out of its step: --strict stopped every fp16 script there. It gets its stand-in
    (none found: the step is taken); the script's own read still stops."""
    with FakeCudaSession(strict=True):
        model = torch.nn.Linear(64, 64).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(torch.randn(8, 64, device="cuda")).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        with pytest.raises(DataDependentError):
            loss.item()


@pytest.mark.parametrize("code, expected", [
    ("loss.item()", 0.0), ("bool(loss > 0)", False), ("float(loss)", 0.0), ("int(n)", 0),
    ("loss.cpu().numpy().tolist()", 0.0), ("f'{loss:.3f}'", "0.000"), ("n.tolist()", 0),
    ("repr(loss).startswith('tensor(<no value')", True), ("bool((loss.abs() > 1e30).any())", False),
])
def test_value_reads_get_a_stand_in_and_a_note_at_the_users_line(code, expected):
    with FakeCudaSession() as s:
        loss = torch.randn(3, device="cuda").sum()   # random: its value is not known (known.py)
        n = torch.randint(0, 9, (), device="cuda")
        got = eval(compile(code, __file__, "eval"), {"loss": loss, "n": n, "torch": torch})
    assert got == expected and type(got) is type(expected)
    (note,) = list(s.notes)
    assert note.kind == "stand-in" and note.where == f"{__file__}:1" and note.count == 1


def test_shapes_from_values_take_their_upper_bound_with_a_note():
    with FakeCudaSession() as s:
        x = torch.randn(4, 5, device="cuda")   # random: its values are not known (known.py)
        assert x[x > 0].shape == (20,)
        assert x.nonzero().shape == (20, 2)
        assert torch.unique(x).shape == (20,)
        assert x.masked_select(x > 0).shape == (20,)
        with pytest.raises(DataDependentError):
            torch.bincount(torch.randint(0, 3, (3,), device="cuda"))
    assert {n.kind for n in s.notes} == {"upper-bound"} and len(s.notes) == 4


def test_torchvision_nms_keeps_at_most_every_box():
    """torchvision.ops.nms (Faster R-CNN's region proposals) returns the indices of the boxes it
    keeps, a count only values decide: its meta kernel refuses meta tensors ("may return an output
    Tensor with data-dependent shape"); the prediction keeps every box (the upper bound), noted at
    the caller's line, and batched_nms's offsets by class run around it."""
    ops = pytest.importorskip("torchvision.ops")
    with FakeCudaSession() as s:
        boxes, scores = torch.rand(300, 4, device="cuda"), torch.rand(300, device="cuda")
        keep = ops.batched_nms(boxes, scores, torch.randint(0, 3, (300,), device="cuda"), 0.7)
        assert keep.shape == (300,) and keep.dtype == torch.long and keep.is_cuda
    assert [(n.kind, n.what) for n in s.notes] == [("upper-bound", "torchvision.ops.nms(): every box kept")]


def test_the_users_own_exception_is_not_relabelled():
    with pytest.raises(ZeroDivisionError):
        with FakeCudaSession():
            torch.ones(2, device="cuda")
            1 / 0


# ============================================================================ a first-principles model
class Block(torch.nn.Module):
    """SDPA attention with dropout after the projection, then a checkpointed MLP."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(D, 3 * D, bias=False)
        self.proj = torch.nn.Linear(D, D, bias=False)
        self.drop = torch.nn.Dropout(0.1)
        self.fc1 = torch.nn.Linear(D, 4 * D, bias=False)
        self.fc2 = torch.nn.Linear(4 * D, D, bias=False)

    def mlp(self, x):
        return self.fc2(F.gelu(self.fc1(x)))

    def forward(self, x):
        q, k, v = self.qkv(x).view(B, S, 3, H, D // H).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(a.transpose(1, 2).reshape(B, S, D)))
        return x + torch.utils.checkpoint.checkpoint(self.mlp, x, use_reentrant=False)


def _train_step(capability=(9, 0)):
    with FakeCudaSession(capability=capability) as s:
        model = Block().cuda()
        opt = torch.optim.AdamW(model.parameters())
        x = torch.randn(B, S, D, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
            s.marker("forward")
            loss = out.float().pow(2).mean()
        s.marker("autocast_exit")
        loss.backward()
        s.marker("backward")
        opt.step()
        s.marker("step")
    return s, model


N_PARAMS = 3 * D * D + D * D + 4 * D * D + 4 * D * D     # qkv, proj, fc1, fc2 (no biases)


def test_parameters_gradients_and_optimizer_state_by_hand():
    s, _ = _train_step()
    assert by_category(s, live_at(s, "forward"))["parameter"] == 4 * N_PARAMS
    after_bwd = by_category(s, live_at(s, "backward"))
    assert after_bwd["gradient"] == 4 * N_PARAMS                 # fp32 grads of fp32 params
    after_step = by_category(s, live_at(s, "step"))
    assert after_step["optimizer_state"] == 2 * 4 * N_PARAMS     # exp_avg + exp_avg_sq (step: CPU)


def test_an_ema_copy_no_forward_runs_holds_parameters():
    """torchvision's --model-ema deep-copies the model (AveragedModel) and runs the copy only to
    evaluate: at 5d2e06d its 32 MiB of weights were labelled activations (the module scope learns
    parameters from models that run)."""
    import copy

    with FakeCudaSession() as s:
        model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).cuda()   # 32 MiB
        ema = copy.deepcopy(model)
        model(torch.randn(4, 1024, device="cuda")).sum().backward()
        s.marker("step")
    assert by_category(s, live_at(s, "step"))["parameter"] == 2 * 8 * (1024 * 1024 + 1024) * 4
    del ema


def test_a_parameter_over_a_tensor_subclass_keeps_it_and_its_memory():
    """torchao's quantize_ and float8 training make `nn.Parameter(<a wrapper subclass>)` (int8 data
    and scales; a float8-cast weight): at bba7eab the parameter became a plain CPU tensor, the
    weights' 64 MiB left the prediction and the script went on as if nothing had happened."""
    from torch.testing._internal.two_tensor import TwoTensor

    with FakeCudaSession() as s:
        a, b = torch.empty(2048, 2048, device="cuda"), torch.empty(2048, 2048, device="cuda")   # 16 MiB each
        p = torch.nn.Parameter(TwoTensor(a, b), requires_grad=False)
        del a, b
        assert type(p) is TwoTensor and p.is_cuda and isinstance(p, torch.nn.Parameter)
        s.marker("made")
    assert by_category(s, live_at(s, "made")) == {"parameter": 2 * 16 * MiB}
    del p


def test_a_model_moved_to_the_gpu_holds_parameters_though_its_forward_never_runs():
    """Weights read directly (`F.linear(x, m.weight)`, torchao quantizing before any forward): at
    bba7eab the 16 MiB weight was labelled a temporary (parameters were learnt from forwards)."""
    with FakeCudaSession() as s:
        m = torch.nn.Linear(2048, 2048, bias=False).cuda()
        with torch.no_grad():
            y = F.linear(torch.empty(8, 2048, device="cuda"), m.weight)
        s.marker("read")
    assert by_category(s, live_at(s, "read"))["parameter"] == 16 * MiB
    del m, y


@pytest.mark.parametrize("move", [lambda m: m.to("cuda"), lambda m: m.to(device="cuda"),
                                  lambda m: m.to(device=torch.device("cuda"), dtype=torch.bfloat16),
                                  lambda m: m.to(dtype=torch.float16, device="cuda", non_blocking=True)])
def test_every_form_of_module_to_moves_the_weights_to_the_gpu(move):
    """timm's train.py moves its model with `model.to(device=device, dtype=model_dtype)`: at bba7eab
    the keyword form left every weight on the meta device, the parameters' memory out of the
    prediction (and under autocast a ViT's patch embedding failed on the bias's dtype)."""
    with FakeCudaSession() as s:
        m = torch.nn.Linear(2048, 2048, bias=False)
        move(m)
        assert m.weight.device == torch.device("cuda", 0)
        s.marker("moved")
    assert by_category(s, live_at(s, "moved"))["parameter"] == 2048 * 2048 * m.weight.element_size()
    del m


def test_autocast_weight_copies_live_while_autocast_or_autograd_needs_them():
    s, model = _train_step()
    casts = {key: size for kind, key, size, _ in s.ops
             if kind == ALLOC and s.infos[key].op == "_to_copy.default" and size in (3 * D * D * 2, D * D * 2,
                                                                                     4 * D * D * 2)}
    # one bf16 copy per weight in forward (cached), one per checkpointed weight in recomputation
    forward = live_at(s, "forward")
    fwd_casts = sorted(size for key, size in casts.items() if key in forward)
    assert fwd_casts == sorted([3 * D * D * 2, D * D * 2, 4 * D * D * 2, 4 * D * D * 2])
    # leaving autocast drops the cache: only proj's copy lives on, saved by its matmul to make the
    # gradient of its input (the attention output). qkv's input x needs no gradient, so qkv's
    # matmul saves x, not the weight; the checkpointed MLP saves nothing.
    after = live_at(s, "autocast_exit")
    assert sorted(size for key, size in casts.items() if key in after) == [D * D * 2]
    assert not any(key in live_at(s, "backward") for key in casts)


def test_dropout_keeps_a_bool_mask_and_flash_attention_its_logsumexp():
    s, _ = _train_step((8, 0))   # an A100: flash (on a Hopper with cuDNN > 9.15, torch picks cuDNN first)
    live = live_at(s, "forward")
    dropout = sorted(size for key, size in live.items() if s.infos[key].op == "native_dropout.default")
    assert dropout == [B * S * D * 1]     # the bool mask is saved; the bf16 output died in the add
    flash = sorted(size for key, size in live.items()
                   if s.infos[key].op == "_scaled_dot_product_flash_attention.default")
    assert flash == sorted([B * H * S * 4, B * S * D * 2, 8, 16])  # logsumexp, out, philox offset/seed
    assert any(s.infos[k].op == "_scaled_dot_product_flash_attention_backward.default" for k in s.infos)


def test_checkpointing_drops_the_mlp_activations_and_recomputes_them_in_backward():
    s, _ = _train_step()
    hidden = B * S * 4 * D * 2                                   # fc1's bf16 output
    fwd_end = next(i for i, n in s.markers if n == "forward")
    bwd_start = next(i for i, n in s.markers if n == "autocast_exit")
    forward_hidden = [key for kind, key, size, _ in s.ops[:fwd_end] if kind == ALLOC and size == hidden]
    assert forward_hidden and not any(k in live_at(s, "forward") for k in forward_hidden)
    recomputed = [key for kind, key, size, _ in s.ops[bwd_start:] if kind == ALLOC and size == hidden
                  and s.infos[key].op in ("mm.default", "gelu.default", "_unsafe_view.default")]
    assert len(recomputed) >= 2                                  # fc1 output and gelu output again


def test_cublas_workspace_per_thread_and_stream_sized_by_capability():
    for capability, size in (((9, 0), 32 * MiB), ((8, 0), 4096 * 1024 * 2 + 16 * 1024 * 8)):
        s, _ = _train_step(capability)
        ws = [(sz, s.records[key].phase) for kind, key, sz, _ in s.ops
              if kind == ALLOC and s.infos[key].op == "cublas_workspace"]
        assert ws == [(size, "forward"), (size, "backward")]   # the caller's thread, autograd's thread
        assert not any(kind != ALLOC and s.infos[key].op == "cublas_workspace" for kind, key, _, _ in s.ops)


def test_sdpa_backend_follows_dtype_and_capability():
    from amem_alloc.predict.rules.platform import Platform
    from amem_alloc.predict.rules.sdpa_select import Params, select
    q16 = torch.empty(B, H, S, 16, dtype=torch.bfloat16, device="meta")
    q32 = torch.empty(B, H, S, 16, device="meta")
    a100, v100 = Platform((8, 0), 108, 92400, 13000, (2, 14)), Platform((7, 0), 80, 92400, 13000, (2, 14))
    call = lambda q, mask=None, plat=a100: select(Params(q, q, q, mask, 0.0, False, False, False), plat)
    assert call(q16) == "flash"
    assert call(q16, torch.empty(S, S, device="meta")) == "efficient"
    assert call(q32) == "efficient"
    assert call(q16, plat=v100) == "math"     # bfloat16 below sm80: no fused kernel


def test_zero_grad_set_to_none_frees_gradients():
    with FakeCudaSession() as s:
        lin = torch.nn.Linear(32, 32, bias=False).cuda()
        lin(torch.randn(4, 32, device="cuda")).sum().backward()
        grad_key = s.storages.key_of(lin.weight.grad)
        s.marker("before")
        lin.zero_grad(set_to_none=True)
        s.marker("after")
    assert grad_key in live_at(s, "before") and grad_key not in live_at(s, "after")


def test_a_step_closure_runs_forward_and_backward_in_their_own_phases():
    """optimizer.step(closure) runs forward and backward inside the step (PyTorch Lightning's
    automatic optimization, LBFGS), and the model goes back to the CPU before the session ends
    (Lightning's teardown), freeing its CUDA parameters and gradients. The closure's allocations are
    forward's and backward's, the ReLU output it saves is an activation, the freed parameters stay
    parameters and every step's gradients are gradients: each category's bytes by hand."""
    width = 4 * D
    with FakeCudaSession() as s:
        model = torch.nn.Sequential(torch.nn.Linear(D, width), torch.nn.ReLU(), torch.nn.Linear(width, D)).cuda()
        opt = torch.optim.AdamW(model.parameters(), foreach=True)
        x = torch.randn(B * S, D, device="cuda")

        def closure():
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            return loss
        for _ in range(2):
            opt.step(closure)
        model.cpu()
    param_bytes = 4 * (D * width + width + width * D + D)
    made = {}
    for kind, key, size, _ in s.ops:
        if kind == ALLOC:
            made.setdefault(s.infos[key].category, []).append((size, s.infos[key].op, s.records[key].phase))
    assert sum(size for size, _, _ in made["parameter"]) == param_bytes
    assert sum(size for size, _, _ in made["gradient"]) == 2 * param_bytes   # two steps' .grad
    assert sum(size for size, op, _ in made["optimizer_state"]) == 2 * param_bytes
    assert (B * S * width * 4, "relu.default", "forward") in made["activation"]
    assert {phase for size, op, phase in made["gradient"]} == {"backward"}


def test_the_deadline_waits_while_a_free_is_being_recorded():
    """An exception raised inside the weak-reference callback that records a free is printed by
    Python ("Exception ignored in ...") and dropped: the --timeout deadline lets that tick pass
    (it raises again a second later) instead of printing a traceback at the user."""
    import sys

    from amem_alloc.predict import script

    frames = []
    with FakeCudaSession() as s:
        record = s.storages.on_free

        def on_free(key):
            frames.append(sys._getframe())
            record(key)
        s.storages.on_free = on_free
        x = torch.empty(10, device="cuda")
        del x
        s.storages.on_free = record
    assert frames and script.in_dropping_callback(frames[0])
    assert not script.in_dropping_callback(sys._getframe())


def test_the_deadline_waits_while_the_collectors_callback_runs():
    """The garbage collector's phase callback (engine/collector.py) is one whose exceptions Python
    drops too: the deadline raised there once printed "Exception ignored in: <bound method
    CollectorWatch._phase ...>" with a traceback at the user (a loaded machine, --timeout 1)."""
    from amem_alloc.predict import script
    from helpers import collector_callback_frame

    assert script.in_dropping_callback(collector_callback_frame())


# ============================================================================ autograd as CUDA runs it
def _backward_adds(size: int) -> int:
    """Allocations of `size` bytes by add.Tensor in backward, for a tensor two branches use."""
    with FakeCudaSession() as s:
        lin = torch.nn.Linear(256, 256).cuda()
        h = lin(torch.randn(64, 256, device="cuda"))
        (h.exp() + h.sin()).sum().backward()
    return sum(1 for kind, key, n, _ in s.ops if kind == ALLOC and n == size
               and s.infos[key].op == "add.Tensor" and s.infos[key].phase == "backward")


def test_gradients_reaching_one_tensor_are_summed_in_place_as_cudas_engine_does(monkeypatch):
    """h feeds exp and sin: their gradients meet in h's input buffer, which CUDA's engine sums in
    place (input_buffer.cpp accumulate: the buffer holds the only reference); meta tensors would
    take the out-of-place branch. rules/autograd.py's accumulate rule reads "only reference" from
    use counts (SOLE_USES): a torch release that changes them fails here, not silently."""
    from amem_alloc.predict.rules import autograd

    size = 64 * 256 * 4
    assert _backward_adds(size) == 0
    monkeypatch.setattr(autograd, "SOLE_USES", (-1, -1))   # the rule never applies: one add out of place
    assert _backward_adds(size) == 1


def test_share_memory_of_a_cuda_tensor_does_nothing_as_on_cuda():
    """Hogwild training shares its model before starting workers (`model.share_memory()`): for a
    CUDA tensor torch does nothing, and a fake one went down the CPU path and raised
    ("_share_fd_: only available on CPU"). A host tensor is still shared for real."""
    with FakeCudaSession() as s:
        model = torch.nn.Linear(64, 64).cuda()
        assert model.share_memory() is model
        weight = model.weight
        assert weight.share_memory_() is weight and weight.is_shared()
        host = torch.zeros(4).share_memory_()
        assert host.is_shared()
    assert [size for kind, _, size, _ in s.ops if kind == ALLOC] == [64 * 64 * 4, 64 * 4]


def test_an_lbfgs_step_says_what_its_value_dependent_history_leaves_out():
    """LBFGS's iterations and history follow the loss's values: under stand-ins a step stopped after
    its first iterations with no history, and the prediction said nothing (pytorch/examples'
    time_sequence_prediction; 1.8 GiB of history after 3 real steps of a 16 MiB model, none
    predicted). Each step says so, with the largest history the optimizer may keep."""
    import amem_alloc

    def main():
        model = torch.nn.Linear(1024, 1024, bias=False).cuda()   # 4 MiB
        opt = torch.optim.LBFGS(model.parameters(), max_iter=7, history_size=10)
        x = torch.randn(64, 1024, device="cuda")

        def closure():
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            return loss
        for _ in range(2):
            opt.step(closure)

    prediction = amem_alloc.predict(main, gpu="H100", policies=["torch"])
    told = [n for n in prediction.notes if n["what"].startswith("LBFGS:")]
    assert len(told) == 1 and told[0]["kind"] == "not-modelled" and told[0]["count"] == 2, told
    assert "max_iter=7" in told[0]["what"] and "history_size=10" in told[0]["what"]
    assert told[0]["what"].endswith("up to 80.00 MiB more than predicted")   # 10 pairs x 2 x 4 MiB


@pytest.mark.parametrize("make", [lambda: torch.ones(3, device="cuda:1"), lambda: torch.ones(3).to("cuda:1"),
                                  lambda: torch.ones(3).cuda(1), lambda: torch.ones(3).to(device=torch.device("cuda", 2))])
def test_a_device_past_the_processs_devices_fails_as_torch_fails(make):
    """On one GPU `torch.ones(3, device="cuda:1")` fails ("invalid device ordinal"); the prediction made
    the tensor on cuda:0 and a script that cannot run was predicted to fit."""
    from amem_alloc.user_script import is_for_the_script

    with FakeCudaSession() as s:
        with pytest.raises(RuntimeError, match="invalid device ordinal") as raised:
            make()
        assert is_for_the_script(raised.value)
        assert torch.ones(3, device="cuda:0").device == torch.device("cuda", 0)
    with FakeCudaSession(device_count=3):   # a process with three devices has them
        assert make().is_cuda
    del s


def test_grouped_mm_in_float32_makes_what_cudas_fallback_loop_makes():
    """transformers' Mixtral and Qwen2-MoE experts call grouped_mm by default on sm90; in float32 CUDA
    takes its fallback loop of mm into one output (GroupedMMUtils.h), where torch's meta kernel
    refused float32 and the script "failed". The output: 64 rows of 18 floats, each padded to 16 bytes."""
    with FakeCudaSession() as s:
        a = torch.empty(64, 32, device="cuda")
        b = torch.empty(4, 32, 18, device="cuda")
        offs = torch.tensor([16, 32, 48, 64], device="cuda", dtype=torch.int32)
        out = torch.nn.functional.grouped_mm(a, b, offs=offs)
        assert out.shape == (64, 18) and out.dtype == torch.float32 and out.stride() == (20, 1)
    made = [size for kind, key, size, _ in s.ops if kind == ALLOC and s.infos[key].op.startswith("_grouped_mm")]
    assert made == [(63 * 20 + 18) * 4]   # empty_strided's storage: the last row unpadded
