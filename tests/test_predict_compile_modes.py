"""torch.compile's modes and recompilation under prediction (amem_alloc/predict/engine/cudagraph_pool.py,
compiled.py):
mode="reduce-overhead" runs a region's graphs in the private pool of inductor's CUDA graph trees,
which stays reserved (torch/_inductor/cudagraph_trees.py: one pool per device, freed only with the
trees); "max-autotune-no-cudagraphs" is the default's partition, with an estimate note that its autotuned
choices are not benchmarked here. References are torch's own: its partitioner run directly on CPU fakes
(test_predict_compile.torch_saved_bytes) and its mode table (`list_mode_options`)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch._inductor.compile_fx")

import amem_alloc  # noqa: E402
from amem_alloc.replay import POOL_BEGIN, POOL_END, POOL_RELEASE  # noqa: E402

from test_predict_compile import HIDDEN, TOKENS, Region, mlp, torch_saved_bytes  # noqa: E402

ROWS, D_IN, D_MID = TOKENS // 8, HIDDEN // 8, HIDDEN // 2


def _run(mode, steps=3):
    seen = {}

    def main():
        x = torch.randn(ROWS, D_IN, device="cuda", requires_grad=True)
        w1 = torch.nn.Parameter(torch.randn(D_MID, D_IN, device="cuda"))
        w2 = torch.nn.Parameter(torch.randn(D_IN, D_MID, device="cuda"))
        step = torch.compile(Region(mlp, w1, w2), mode=mode)
        for _ in range(steps):
            step(x).backward()
        x.grad = w1.grad = w2.grad = None
        torch.cuda.empty_cache()
        seen["reserved"] = torch.cuda.memory_reserved()

    prediction = amem_alloc.predict(main, gpu="H100", policies=["torch"])
    return prediction, seen


def _status(prediction) -> str:
    return next(n["what"] for n in prediction.notes if n["what"].startswith("torch.compile region"))


def test_reduce_overhead_keeps_the_graphs_memory_in_a_private_pool_that_stays_reserved():
    """After the steps, with every gradient dropped and empty_cache called, the default mode keeps
    only the parameters' and input's segments; under reduce-overhead the trees' pool stays reserved
    too, at least what the forward saves for backward (it was in the pool at the peak)."""
    from torch._inductor import list_mode_options

    assert list_mode_options("reduce-overhead") == {"triton.cudagraphs": True}   # what the mode asks of inductor
    saved = torch_saved_bytes(mlp, ((ROWS, D_IN), torch.float32, True), ((D_MID, D_IN), torch.float32, True),
                              ((D_IN, D_MID), torch.float32, True))
    default, plain = _run(None)
    pooled, graphs = _run("reduce-overhead")
    assert graphs["reserved"] - plain["reserved"] >= saved
    kinds = [op[0] for op in pooled.run.ops]
    assert kinds.count(POOL_BEGIN) == kinds.count(POOL_END) == 3 * 2   # forward and backward graphs, each step
    assert kinds.count(POOL_RELEASE) == 0                               # the trees keep it
    assert POOL_BEGIN not in [op[0] for op in default.run.ops]
    assert "reduce-overhead" in _status(pooled)


def test_max_autotune_without_cudagraphs_is_the_default_partition_with_a_note():
    from torch._inductor import list_mode_options

    assert "triton.cudagraphs" not in list_mode_options("max-autotune-no-cudagraphs")
    default, plain = _run(None, steps=1)
    tuned, seen = _run("max-autotune-no-cudagraphs", steps=1)
    assert seen["reserved"] == plain["reserved"]
    assert [op[:3] for op in tuned.run.ops] == [op[:3] for op in default.run.ops]   # the same allocations
    notes = [n["what"] for n in tuned.notes if n["kind"] == "estimate"]
    assert any(n.startswith("max-autotune") for n in notes)   # the kernel choice needs the GPU's benchmarks
    assert not any(n["what"].startswith("max-autotune") for n in default.notes)
    assert POOL_BEGIN not in [op[0] for op in tuned.run.ops]


def test_a_new_shape_is_traced_again_each_at_its_own_partition():
    """torch recompiles on a new shape; from the second distinct shape on, its default
    (`automatic_dynamic_shapes`) makes one graph with a dynamic size that serves every later shape
    (run here, on CPU, with torch's own dynamo). amem traces each distinct shape statically: the same
    allocation sizes the dynamic graph makes at that shape, one trace per shape, and each saves what
    torch's partitioner saves at that shape."""
    from amem_alloc.predict.engine.session import FakeCudaSession
    from test_predict_compile import H100, survivors

    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    reference = torch.compile(mlp, backend=counting)
    w1, w2 = torch.randn(D_MID, D_IN, requires_grad=True), torch.randn(D_IN, D_MID, requires_grad=True)
    for rows in (64, 128, 256):
        reference(torch.randn(rows, D_IN, requires_grad=True), w1, w2)
    torch._dynamo.reset()
    assert len(graphs) == 2   # the first shape static, then one dynamic graph for the rest

    s = FakeCudaSession(**H100)
    with s:
        w1, w2 = (torch.nn.Parameter(torch.randn(*shape, device="cuda")) for shape in ((D_MID, D_IN), (D_IN, D_MID)))
        step = torch.compile(mlp)
        for rows in (64, 128, 256, 128):
            x = torch.randn(rows, D_IN, device="cuda", requires_grad=True)
            s.marker(f"forward {rows}")
            loss = step(x, w1, w2)
            s.marker(f"backward {rows}")
            loss.backward()
            del loss
    assert len(s.compile_regions) == 3   # the fourth call's shape was traced already
    for rows, region in zip((64, 128, 256), s.compile_regions):
        want = torch_saved_bytes(mlp, ((rows, D_IN), torch.float32, True), ((D_MID, D_IN), torch.float32, True),
                                 ((D_IN, D_MID), torch.float32, True))
        assert region["saved_bytes"] == want, rows
        assert survivors(s, f"forward {rows}", f"backward {rows}") == want + 4


@pytest.mark.parametrize("switch", ["TORCHDYNAMO_DISABLE", "TORCH_COMPILE_DISABLE", "disable=True"])
def test_compiling_switched_off_is_torchs_no_op_with_no_note(monkeypatch, switch):
    """With TORCHDYNAMO_DISABLE=1 torch.compile hands the model back; amem tried to compile it anyway,
    and its note said the region fell back to eager on "'_NullDecorator' object has no attribute
    'callback'" (litgpt users switch compiling off so)."""
    kwargs = {"disable": True} if switch == "disable=True" else {}
    if not kwargs:
        monkeypatch.setenv(switch, "1")
    import torch._dynamo.config as dynamo_config
    seen = {}

    def main():
        model = torch.nn.Linear(256, 256).cuda()
        compiled = torch.compile(model, **kwargs)
        seen["same"] = compiled is model
        compiled(torch.randn(64, 256, device="cuda")).sum().backward()

    with dynamo_config.patch(disable=switch == "TORCH_COMPILE_DISABLE"):   # what that variable sets at import
        prediction = amem_alloc.predict(main, gpu="H100", policies=["torch"])
    assert seen["same"] == (switch != "TORCH_COMPILE_DISABLE")   # torch's own answer: the model, or a wrapper
    assert not [n for n in prediction.notes if "torch.compile" in n["what"]], prediction.notes
