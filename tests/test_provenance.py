"""amem_alloc.provenance(tensor) and the Tracer: what each record says, categories and phases,
and bad input (tensors nobody traced, freed saved tensors, models without parameters or grad)."""
import json

import pytest
import torch

import amem_alloc
from amem_alloc import Tracer, provenance


def gpu_rounded(nbytes: int) -> int:
    return 0 if nbytes == 0 else -(-nbytes // 512) * 512


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.mlp = torch.nn.Sequential()
        self.mlp.add_module("fc1", torch.nn.Linear(d, 2 * d))
        self.mlp.add_module("act", torch.nn.GELU())
        self.mlp.add_module("fc2", torch.nn.Linear(2 * d, d))

    def forward(self, x):
        return x + self.mlp(x)


class Net(torch.nn.Module):
    def __init__(self, d=8, n=4):
        super().__init__()
        self.layers = torch.nn.ModuleList(Block(d) for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.fixture
def step():
    """One traced training step of Net; returns (tracer, model, optimizer, input, what forward kept)."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(5, 8)
    kept = {}

    def grab(module, args, out):
        kept["fc1_out"] = out

    model.layers[3].mlp.fc1.register_forward_hook(grab)
    with Tracer(model, stacks=True) as t:
        out = model(x)
        loss = out.pow(2).mean()
        kept["during"] = provenance(kept["fc1_out"])
        loss.backward()
        opt.step()
    return t, model, opt, x, kept


def test_a_forward_tensor_has_its_op_module_phase_nodes_and_block(step):
    t, model, opt, x, kept = step
    fc1_out = kept["fc1_out"]  # layers.3.mlp.fc1's output: saved by GELU's backward (its input)
    p = provenance(fc1_out)
    assert p.traced and p.op == "aten.addmm.default" and p.module == "layers.3.mlp.fc1"
    assert (p.phase, p.category) == ("forward", "activation")
    assert (p.dtype, p.shape) == ("float32", [5, 16])
    assert p.requested_bytes == p.storage_bytes == 5 * 16 * 4
    assert p.block_size == gpu_rounded(5 * 16 * 4) and p.address == fc1_out.untyped_storage().data_ptr()
    assert p.allocator == "cpu" and p.segment is None and p.stream is None
    assert "GeluBackward0.self" in p.saved_by_labels
    assert all(s["state"] == "released" for s in p.saved_by)  # backward has run since
    assert any("until backward freed it" in n for n in p.notes)
    assert p.seq > 0 and p.time_ns >= 0
    assert any("test_provenance.py" in frame for frame in p.stack)
    during = kept["during"]
    assert during.saved_by[0]["state"] == "held" and during.seq == p.seq
    json.dumps(p.to_dict())
    assert "layers.3.mlp.fc1" in str(p)


def test_sequence_numbers_and_times_increase_in_allocation_order(step):
    t = step[0]
    rows = t.allocations()
    seqs = [r["seq"] for r in rows]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    recs = sorted(list(t.table.freed) + [w.record for w in t.table.live.values()], key=lambda r: r.seq)
    times = [r.time_ns for r in recs]
    assert times == sorted(times)


def test_categories_of_a_training_step(step):
    t, model, opt, x, kept = step
    w = model.layers[0].mlp.fc1.weight
    assert provenance(w).category == "parameter" and provenance(w).what == "parameter layers.0.mlp.fc1.weight"
    g = provenance(w.grad)
    assert (g.category, g.phase) == ("gradient", "backward")
    assert g.what == "the .grad of parameter layers.0.mlp.fc1.weight"
    assert g.grad_node == "AddmmBackward0" and g.module == "layers.0.mlp.fc1"
    s = provenance(opt.state[w]["exp_avg"])
    assert (s.category, s.phase) == ("optimizer_state", "optimizer")
    assert s.what == "optimizer state: exp_avg of parameter layers.0.mlp.fc1.weight"
    i = provenance(x)
    assert i.category == "input" and not i.traced
    rows = t.allocations()
    cats = {r["category"] for r in rows}
    assert {"temporary", "autograd_detail", "gradient", "optimizer_state"} <= cats
    phases = {r["phase"] for r in rows}
    assert {"forward", "backward", "optimizer"} <= phases
    # the loss is computed outside the model, but it joins the graph: forward work
    loss_rows = [r for r in rows if r["op"] == "aten.mean.default"]
    assert loss_rows and all(r["phase"] == "forward" and r["module"] is None for r in loss_rows)


def test_summary_counts_every_allocation(step):
    t = step[0]
    s = t.summary()
    assert s["allocations"] == len(t.allocations())
    assert set(s["by_phase"]) <= {"forward", "backward", "optimizer", "other"}
    assert sum(v["storages"] for v in s["by_phase"].values()) == s["allocations"]


def test_activation_report_after_backward_says_the_saved_tensors_were_freed(step):
    t = step[0]
    rep = t.activations()
    assert rep.status == "freed" and "backward has freed" in rep.message
    assert rep.total["nominal_bytes"] > 0  # the figures are kept as they were when backward began
    assert all(r["state"] == "released" for r in rep.saved)


# ---------------------------------------------------------------- bad input ---------------------

def test_a_tensor_no_tracer_made_still_gets_a_record():
    y = torch.ones(300, dtype=torch.float64)
    p = provenance(y)
    assert not p.traced and p.op is None and p.phase is None
    assert (p.dtype, p.shape, p.storage_bytes) == ("float64", [300], 2400)
    assert p.block_size == gpu_rounded(2400) == 2560 and p.allocator == "cpu"
    assert any("no tracer saw" in n for n in p.notes)
    assert any("CPU tensor" in n for n in p.notes)
    json.dumps(p.to_dict())


def test_provenance_rejects_what_is_not_a_tensor_and_explains_tensors_without_storage():
    with pytest.raises(TypeError):
        provenance([1, 2, 3])
    sparse = torch.eye(4).to_sparse()
    p = provenance(sparse)
    assert p.block_size is None and "no plain storage" in p.notes[0]
    assert provenance(torch.empty(0)).block_size == 0


def test_model_without_parameters():
    x = torch.randn(6, 7, requires_grad=True)
    relu = torch.nn.ReLU()
    with Tracer(relu) as t:
        y = relu(x)
    rep = t.activations()
    assert [r["label"] for r in rep.saved] == ["ReluBackward0.result"]
    assert rep.total["nominal_bytes"] == 6 * 7 * 4
    del y


def test_no_grad_inference_mode_and_frozen_models_save_nothing():
    model, x = torch.nn.Linear(4, 4), torch.randn(2, 4)
    for context in (torch.no_grad, torch.inference_mode):
        with Tracer(model) as t, context():
            model(x)
        rep = t.activations()
        assert rep.status == "empty" and "no autograd node" in rep.message and rep.total["storages"] == 0
        assert any(r["phase"] == "forward" for r in t.allocations())
    frozen = torch.nn.Linear(4, 4).requires_grad_(False)
    with Tracer(frozen) as t:
        frozen(x)
    assert t.activations().status == "empty"
    assert t.steps == 0


def test_the_tracer_refuses_bad_arguments_nesting_and_reuse():
    with pytest.raises(TypeError):
        Tracer("model")
    with Tracer() as t:
        with pytest.raises(RuntimeError, match="do not nest"):
            with Tracer():
                pass
    with pytest.raises(RuntimeError, match="one scope"):
        with t:
            pass
    with pytest.raises(IndexError):
        t.activations(step=3)


def test_an_exception_inside_leaves_nothing_installed():
    model = Net()
    with pytest.raises(ValueError):
        with Tracer(model):
            model(torch.randn(2, 8))
            raise ValueError("boom")
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    y = model(torch.randn(2, 8))  # the model still works, untraced
    assert y.shape == (2, 8)


def test_several_steps_are_reported_separately():
    model, x = torch.nn.Linear(3, 3), torch.randn(2, 3, requires_grad=True)
    with Tracer(model) as t:
        for _ in range(3):
            model(x).sum().backward()
    assert t.steps == 3
    for i in (1, 2, 3):
        rep = t.activations(step=i)
        assert rep.total["nominal_bytes"] == 2 * 3 * 4  # x (mat1); the weight is not counted
    assert len(t.to_dict()["activations"]) == 3


def test_offloading_hooks_around_the_tracer_are_left_in_charge():
    model, x = torch.nn.Linear(4, 4), torch.randn(2, 4, requires_grad=True)
    with torch.autograd.graph.save_on_cpu(), Tracer(model) as t:
        y = model(x)
    rep = t.activations()
    assert t.hooks_mode == "outer" and rep.status == "nothing saved"
    assert "before the tracer started" in rep.message
    with Tracer(model) as t2, torch.autograd.graph.save_on_cpu():
        y = model(x)
    rep2 = t2.activations()
    assert rep2.saved and all(r["state"] == "other_hooks" and "save_on_cpu" in r["note"] for r in rep2.saved)
    y.sum().backward()


def test_amem_alloc_exports():
    assert amem_alloc.Tracer is Tracer
    assert callable(amem_alloc.provenance) and amem_alloc.provenance.Tracer is Tracer
    assert amem_alloc.provenance(torch.ones(1)).dtype == "float32"


def test_buffers_saved_by_batchnorm_are_model_state_and_its_statistics_are_not():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8))
    with Tracer(model) as t:
        y = model(torch.randn(6, 8))
    by = {r["label"]: r for r in t.activations().saved}
    for name in ("running_mean", "running_var"):
        r = by[f"NativeBatchNormBackward0.{name}"]
        assert (r["kind"], r["what"], r["counted"]) == ("buffer", f"buffer 1.{name}", False)
    for name in ("result1", "result2"):  # the batch mean and inverse std: made here, 8 floats each
        r = by[f"NativeBatchNormBackward0.{name}"]
        assert r["counted"] and r["nominal_bytes"] == 8 * 4
    del y


def test_reentrant_checkpoint_saves_its_inputs_on_its_own_node():
    seq = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    x = torch.randn(4, 8, requires_grad=True)
    with Tracer(seq) as t:
        z = torch.utils.checkpoint.checkpoint(seq, x, use_reentrant=True)
    rep = t.activations()
    (row,) = rep.saved
    assert row["label"] == "CheckpointFunctionBackward.saved_tensors[0]" and row["kind"] == "input"
    assert row["module"] is None and rep.total["nominal_bytes"] == 4 * 8 * 4  # called outside the model
    z.sum().backward()
    assert t.activations().status == "freed"
