"""Known values (amem_alloc/predict/engine/known.py): small fake CUDA tensors made from known data keep
their real values, so reads of them give what a GPU gives, with no stand-in; values computed from
unknowable data (random numbers, what an op with an unknown input writes) still get stand-ins."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from amem_alloc.predict.engine.known import MAX_ELEMENTS, MAX_INDEX_ELEMENTS
from amem_alloc.predict.engine.session import FakeCudaSession


def _stand_ins(session) -> list:
    return [n for n in session.notes if n.kind == "stand-in"]


def test_values_made_from_known_data_are_read_as_a_gpu_reads_them():
    with FakeCudaSession() as s:
        pos = torch.arange(6, device="cuda")[None]
        assert pos.device == torch.device("cuda", 0)
        assert (torch.diff(pos, dim=-1) != 1).cumsum(-1)[:, -1].item() == 0
        moved = torch.tensor([3, 1, 2]).cuda()
        assert moved.tolist() == [3, 1, 2] and int(moved.max()) == 3
        assert torch.tensor([[1, 0], [1, 1]], device="cuda").all().item() is False
        assert f"{torch.full((), 2.5, device='cuda') * 2:.2f}" == "5.00"
        assert torch.ones(4, device="cuda").cpu().numpy().tolist() == [1.0] * 4
        buf = torch.empty(3, device="cuda")
        buf.copy_(torch.tensor([7.0, 8.0, 9.0]))   # copy_ writes every element: known from here
        assert buf.sum().item() == 24.0
    assert not _stand_ins(s), list(s.notes)


def test_shapes_from_known_values_are_the_true_shapes():
    with FakeCudaSession() as s:
        x = torch.tensor([0, 2, 0, 5], device="cuda")
        assert x.nonzero().shape == (2, 1)
        assert x[x > 0].tolist() == [2, 5]
        assert torch.unique(x).shape == (3,)
        assert torch.bincount(x).shape == (6,)   # no upper bound, but its inputs are known
    assert not list(s.notes), list(s.notes)


def test_unknown_values_still_get_stand_ins():
    with FakeCudaSession() as s:
        noise = torch.randn(3, device="cuda")                  # random
        assert noise.sum().item() == 0.0
        found_inf = torch.full((1,), 0.0, device="cuda")      # known, then written from an unknown
        assert found_inf.item() == 0.0
        found_inf.add_(noise.sum())
        found_inf.fill_(1.0).add_(noise[:1])
        assert found_inf.item() == 0.0
        big = torch.arange(MAX_ELEMENTS + 1, dtype=torch.float32, device="cuda")   # over the cap: not shadowed
        assert big[-1].item() == 0.0
        garbage = torch.empty(4, device="cuda")               # uninitialised memory
        assert garbage.tolist() == [0.0] * 4
    lines = sorted(n.what for n in _stand_ins(s))
    assert len(lines) == 4, lines   # noise, found_inf once written, big, garbage


def test_a_check_that_every_element_holds_holds_on_unknown_values():
    """`all()` of unknown values (a distribution's support check, an assert) is true, as on a GPU
    where the program works, and noted as assumed: the zero stand-in made torch.distributions raise
    "found invalid values" at every log_prob. An `any()` test of a fault stays false (zero)."""
    with FakeCudaSession() as s:
        noise = torch.randn(64, device="cuda")
        assert (noise == noise).all() and torch.isfinite(noise).all(dim=0).item() is True
        assert not torch.isnan(noise).any()
        normal = torch.distributions.Normal(torch.zeros(64, device="cuda"), torch.ones(64, device="cuda"),
                                            validate_args=True)   # (a library may turn the default off)
        assert normal.log_prob(normal.rsample((4,))).shape == (4, 64)
        policy = torch.distributions.Categorical(logits=torch.randn(8, 6, device="cuda"), validate_args=True)
        assert policy.log_prob(policy.sample()).shape == (8,)
    assumed = [n for n in s.notes if n.kind == "assumed"]
    assert len(assumed) >= 4 and all(set(n.seen["expected"]) <= {True, False} for n in assumed), \
        [(n.what, n.seen) for n in assumed]


def test_whole_tensor_comparisons_hold_on_unknown_values_and_are_true_on_known_ones():
    """`assert torch.allclose(a, b)` (torch.func's tutorials) failed inside amem, allclose's kernel
    reading a value of meta tensors, read as the script's failure; `torch.equal` answered False and
    the script's assert failed. Unknown, both hold (noted), as `all()` does; known, they answer what
    a GPU answers."""
    with FakeCudaSession() as s:
        a = torch.randn(10, 64, device="cuda")
        assert torch.allclose(a, a * 1.0) and torch.equal(a, a.clone())
        ids = torch.arange(4, device="cuda")
        assert torch.equal(ids, torch.tensor([0, 1, 2, 3]).cuda())
        assert not torch.equal(ids, torch.tensor([0, 1, 2, 4]).cuda())
        assert not torch.allclose(ids.float(), ids.float() + 1)
    said = sorted(n.what for n in s.notes if n.kind == "stand-in")
    assert said == ["torch.allclose: True", "torch.equal: True"], said


def test_a_values_check_for_nan_or_inf_finds_none():
    """A program that works on the GPU computes numbers: `isfinite` is true, `isnan`/`isinf` and
    `x != x` false, and noted as assumed (rules/data_dependent.py `finite`). The zero stand-in read
    a finite loss as not finite: ultralytics' `if not torch.isfinite(loss)` took the nan branch."""
    with FakeCudaSession() as s:
        loss = (torch.randn(8, device="cuda", requires_grad=True) * 2).sum()
        assert bool(torch.isfinite(loss)) and bool(loss.isfinite().all())
        assert not torch.isnan(loss) and not torch.isinf(loss).any() and not torch.isposinf(loss)
        assert not (loss != loss) and bool(loss == loss)
        assert not (loss.abs() == float("inf")) and bool(loss.abs() != float("-inf"))
        mixed = torch.randn(4, device="cuda")
        assert (mixed == torch.randn(4, device="cuda")).shape == (4,)   # two tensors: nothing assumed
    assumed = [n for n in s.notes if n.kind == "assumed"]
    assert assumed and {v for n in assumed for v in n.seen["expected"]} == {True, False}, \
        [(n.what, n.seen) for n in assumed]


def test_a_known_value_brought_to_the_host_is_the_real_tensor():
    """`.cpu()` of a fake tensor whose value is known gives the real host tensor torch would (a
    generator's state sent through the device and back: torch.Generator.set_state takes only a
    real ByteTensor); an unknown value stays a fake host tensor."""
    from amem_alloc.predict.engine.values import is_fake

    with FakeCudaSession():
        generator = torch.Generator()
        state = generator.get_state().to("cuda").cpu()
        assert not is_fake(state) and torch.equal(state, generator.get_state())
        generator.set_state(state)
        assert torch.arange(4, device="cuda").cpu().tolist() == [0, 1, 2, 3]
        assert is_fake(torch.randn(4, device="cuda").cpu())


def test_a_parameter_whose_values_a_checkpoint_gave_moves_to_the_host_with_its_gradient():
    """A parameter loaded from a checkpoint holds known values; `module.cpu()` moves it and its
    gradient (unknown) as one kind of copy, as on the GPU: with a real copy of the parameter and a
    fake one of its gradient, torch's `_apply` failed "out_param.grad must not be None" (Lightning's
    teardown after its batch size finder restored its checkpoint)."""
    from amem_alloc.predict.engine.values import is_fake

    with FakeCudaSession():
        model = torch.nn.Linear(4, 4).cuda()
        model(torch.randn(2, 4, device="cuda")).sum().backward()
        model.load_state_dict({"weight": torch.ones(4, 4), "bias": torch.zeros(4)})
        weight = model.weight
        model.cpu()
        assert model.weight is weight and weight.device.type == "cpu" and weight.grad.device.type == "cpu"
        assert is_fake(weight) and weight.grad is not None


def test_integer_tensors_are_shadowed_up_to_a_larger_cap():
    """Indices and masks decide sizes and branches: they are shadowed up to MAX_INDEX_ELEMENTS
    (floating tensors up to MAX_ELEMENTS)."""
    with FakeCudaSession() as s:
        ids = torch.arange(MAX_ELEMENTS * 2, device="cuda")
        assert ids[-1].item() == MAX_ELEMENTS * 2 - 1
        assert (ids % 2 == 0).nonzero().shape == (MAX_ELEMENTS, 1)
        huge = torch.arange(MAX_INDEX_ELEMENTS + 1, device="cuda")
        assert huge[-1].item() == 0   # over the index cap: a stand-in
    assert len(_stand_ins(s)) == 1


def test_strict_does_not_stop_at_a_known_value():
    """--strict stops where a stand-in would be used; a known value needs none."""
    with FakeCudaSession(strict=True) as s:
        assert torch.arange(4, device="cuda").sum().item() == 6
    assert not list(s.notes)


# ---------------------------------------------------------------------------- writes of unknown values
def _model_loss():
    """A fake loss, as an evaluation loop's model gives it (unknown: computed from parameters)."""
    model = torch.nn.Linear(8, 1).cuda()
    return model(torch.randn(4, 8, device="cuda")).square().mean()


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("read", ["item", "tensor"])
def test_nanogpts_estimate_loss_pattern_runs(device, read):
    """nanoGPT's estimate_loss: `losses = torch.zeros(eval_iters)` (on the CPU; some loops put it on
    the GPU), `losses[k] = loss.item()` or `= loss`, then `losses.mean()` printed. The stand-in
    (0.0) is what the losses hold; it is noted where it was made."""
    eval_iters = 3
    with torch.no_grad(), FakeCudaSession() as s:
        losses = torch.zeros(eval_iters, device=device)
        for k in range(eval_iters):
            loss = _model_loss()
            losses[k] = loss.item() if read == "item" else loss
        text = f"{losses.mean():.4f}"
        listed = losses.tolist()
    assert text == "0.0000" and listed == [0.0] * eval_iters
    stand_ins = sorted(n.what for n in _stand_ins(s))
    if read == "item":   # a stand-in number written: the tensor holds it and stays known, no second note
        assert stand_ins == ["item() of a CUDA tensor: 0.0"] and _stand_ins(s)[0].count == eval_iters
    elif device == "cpu":   # a real tensor written from a fake one: it keeps what it held, noted at the write
        assert stand_ins == ["a CUDA tensor's value written into a CPU tensor (copy_): the CPU tensor keeps what it held"]
    else:   # a known tensor written with an unknown value: unknown, its reads are stand-ins
        assert stand_ins == ["a formatted value (f-string) of a CUDA tensor: text without a value",
                             "tolist() of a CUDA tensor: zeros"]


UNKNOWN_WRITES = {
    "index assignment": lambda t, u: t.__setitem__(1, u.sum()),
    "index_put_": lambda t, u: t.index_put_((torch.tensor([2], device="cuda"),), u[:1]),
    "copy_": lambda t, u: t.copy_(u),
    "copy_ into a slice": lambda t, u: t[1:].copy_(u[1:]),
    "fill_ with a tensor": lambda t, u: t.fill_(u.sum()),
    "add_ with an unknown operand": lambda t, u: t.add_(u),
    "out=": lambda t, u: torch.mul(u, 2, out=t),
    "a view written": lambda t, u: t.view(2, 2)[0].mul_(u[:2]),
    "masked_fill_ with a tensor": lambda t, u: t.masked_fill_(t > 2, u.sum()),
    "scatter_": lambda t, u: t.scatter_(0, torch.tensor([0], device="cuda"), u[:1]),
}


@pytest.mark.parametrize("name", list(UNKNOWN_WRITES))
def test_an_unknown_write_makes_a_known_tensor_and_its_views_unknown(name):
    """A known tensor (1, 2, 3, 4) written with an unknown value holds no value any more: reads of
    it, and of a view made before the write, get stand-ins (zeros), never the stale truth."""
    with FakeCudaSession() as s:
        t = torch.arange(1.0, 5.0, device="cuda")
        view = t[2:]
        assert t.tolist() == [1.0, 2.0, 3.0, 4.0]
        UNKNOWN_WRITES[name](t, torch.randn(4, device="cuda"))
        assert t.tolist() == [0.0] * 4 and view.tolist() == [0.0] * 2
        assert t.sum().item() == 0.0
    reads = sorted((n.what, n.count) for n in _stand_ins(s))
    assert reads == [("item() of a CUDA tensor: 0.0", 1), ("tolist() of a CUDA tensor: zeros", 2)], reads


def test_known_writes_keep_a_tensor_known():
    with FakeCudaSession() as s:
        t = torch.arange(4.0, device="cuda")
        t[0] = 5
        t[1:3] += 1
        t.index_put_((torch.tensor([3], device="cuda"),), torch.tensor([9.0], device="cuda"))
        t.view(2, 2)[1, 0].mul_(torch.tensor(2.0, device="cuda"))
        assert t.tolist() == [5.0, 2.0, 6.0, 9.0]
        cpu = torch.zeros(3)
        cpu[1] = torch.tensor(7.0, device="cuda")   # a known value into a real tensor: the truth
        cpu[2:] = t[3:]
        assert cpu.tolist() == [0.0, 7.0, 9.0]
    assert not list(s.notes), list(s.notes)


def test_a_real_tensor_written_from_an_unknown_one_keeps_what_it_held():
    """A real CPU tensor cannot hold "unknown": a fake value written into it leaves it as it was
    (noted), so a library's own bookkeeping copied back from the device (DDP's reducer: its bucket
    indices) reads what it wrote itself, never zeros it did not write."""
    with FakeCudaSession() as s:
        buffer = torch.ones(2, 3)
        buffer[0].copy_(torch.randn(3, device="cuda"))
        buffer += torch.randn(2, 3, device="cuda").cpu()   # a fake CPU tensor, brought from the GPU
        assert buffer.tolist() == [[1.0] * 3, [1.0] * 3]
    assert sorted(n.what for n in _stand_ins(s)) == [
        "a CUDA tensor's value written into a CPU tensor (copy_): the CPU tensor keeps what it held",
        "a value computed on the GPU written into a CPU tensor (add_): the CPU tensor keeps what it held"]


def test_a_write_that_cannot_run_on_the_cpu_makes_its_target_unknown():
    """An in-place op whose kernel CUDA has and the CPU lacks: its known target's shadow is not left
    holding the values from before the write."""
    lib = torch.library.Library("amem_known_test", "FRAGMENT")
    lib.define("bump_(Tensor(a!) x) -> Tensor(a!)")
    lib.impl("bump_", lambda x: x, "Meta")
    with FakeCudaSession() as s:
        t = torch.arange(1.0, 4.0, device="cuda")
        torch.ops.amem_known_test.bump_(t)
        assert t.tolist() == [0.0] * 3
    assert [n.what for n in _stand_ins(s)] == ["tolist() of a CUDA tensor: zeros"]


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_known_data_moved_to_the_device_keeps_its_values_under_inference_mode(mode):
    """Under inference mode `Tensor.to` reaches the recorder whole (`to.dtype_layout`, a composite)
    and `torch.tensor(data, device=)` dispatches a `detach_`: the host tensor was made fake before
    the composite opened, and the factory's value was not kept. transformers' padding-mask check
    then read an assumed True and its (B, 1, T, T) mask was never allocated."""
    with FakeCudaSession() as s:
        with mode():
            moved = torch.tensor([1, 0, 1]).to("cuda")
            made = torch.tensor([1, 0, 1], device="cuda")
            cuda = torch.tensor([[1, 1], [0, 1]]).cuda()
            noise = torch.randn(3, device="cuda")
            assert moved.tolist() == made.tolist() == [1, 0, 1] and cuda.tolist() == [[1, 1], [0, 1]]
            assert bool((moved == 0).any()) and not bool(cuda.all())
        assert s.known.value(noise) is None   # random values are never known
    assert not [n for n in s.notes if n.kind in ("stand-in", "assumed")], [n.what for n in s.notes]


def test_known_values_survive_a_library_wrapping_torchs_factories(monkeypatch):
    """Failed at 5d2e06d: inside DeepSpeed's zero.Init (every HF from_pretrained under ZeRO-3) torch.zeros
    defaults its device to CUDA; amem's own host copy of a known value went through it and reached
    the driver ("Found no NVIDIA driver", read as amem's failure)."""
    zeros = torch.zeros

    def defaults_to_cuda(*args, **kwargs):   # partition_parameters.py's zero_wrapper_for_fp_tensor_constructor
        kwargs.setdefault("device", torch.device("cuda", 0))
        return zeros(*args, **kwargs)

    with FakeCudaSession():
        monkeypatch.setattr(torch, "zeros", defaults_to_cuda)
        weight = torch.ones(16, device="cuda")   # LlamaRMSNorm's weight: known values
        assert weight.sum().item() == 16.0
