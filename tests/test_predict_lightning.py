"""PyTorch Lightning's Trainer under prediction, unchanged (tests/programs/lightning_trainer.py): one
GPU, then DDP and FSDP under torchrun with 2 processes. Model state against first principles, to
the byte. Lightning is not a dependency of amem: these tests skip where it is not installed.

What Lightning met in the engine (each also covered without Lightning, in test_predict_engine.py
and test_predict_distributed.py): its automatic optimization runs forward and backward inside
`optimizer.step(closure)`; its teardown moves the model back to the CPU, freeing the CUDA
parameters before the prediction ends; its DDP strategy broadcasts its log folder with
`broadcast_object_list`, which the fake process group cannot carry."""
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lightning")

import program_figures as pf  # noqa: E402
from test_predict_distributed import _predict_argv, live_at_end, padded_flat_numel  # noqa: E402
from test_predict_programs import category_maxima, predict  # noqa: E402

PROGRAMS = Path(__file__).parent / "programs"
VOCAB, D, LAYERS, CLASSES = 1000, 128, 2, 2   # lightning_trainer.py's defaults


def block_shapes(d: int = D) -> list[tuple]:
    """nn.TransformerEncoderLayer(d, heads, 4 d)'s parameters, in registration order."""
    return [(3 * d, d), (3 * d,), (d, d), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,), (d,), (d,), (d,), (d,)]


def param_shapes() -> list[tuple]:
    return [(VOCAB, D)] + block_shapes() * LAYERS + [(CLASSES, D), (CLASSES,)]


def test_single_gpu_trainer_holds_params_grads_and_adamw_state(tmp_path):
    """Trainer(accelerator="gpu", devices=1), AdamW (foreach: its step counts stay on the CPU): the
    parameters, their gradients and AdamW's two states, each to the byte; forward and backward,
    which run inside optimizer.step(closure), are not called the optimizer's."""
    p = predict("lightning_trainer.py", [], PROGRAMS, tmp_path)
    assert p.returncode == 0, p.why()
    params = pf.storages(param_shapes())
    most = category_maxima(p.trace)
    assert (most["parameter"], most["gradient"], most["optimizer_state"]) == (params, params, 2 * params), most
    assert p.data["at_peak_phase"] in ("forward", "backward") and most["activation"] > 0


def test_a_compiled_lightning_module_is_trained_as_compiled(tmp_path):
    """`torch.compile(model)` before `Trainer.fit`: Lightning accepts only torch's OptimizedModule,
    takes its module out and compiles the module's `forward` and `training_step` with the compiled
    module's context (lightning/pytorch/utilities/compile.py `from_compiled`). Under prediction
    that is what it gets: the steps run as compiled regions (noted as compiled, none eager), and
    the model state is the uncompiled run's, to the byte."""
    p = predict("lightning_trainer.py", ["--compile", "--precision", "bf16-mixed"], PROGRAMS, tmp_path)
    assert p.returncode == 0, p.why()
    notes = [n for n in p.data["notes"] if n["what"].startswith("torch.compile")]
    assert notes and all(n["kind"] == "compiled" for n in notes), notes
    assert any(n["what"].startswith("torch.compile region Classifier: predicted as compiled (inductor)")
               for n in notes), notes
    assert p.data["compiled_regions"] and all(r["saved_bytes"] > 0 for r in p.data["compiled_regions"]), \
        p.data["compiled_regions"]
    params = pf.storages(param_shapes())
    most = category_maxima(p.trace)
    assert (most["parameter"], most["gradient"], most["optimizer_state"]) == (params, params, 2 * params), most


def test_ddp_strategy_under_torchrun_holds_each_ranks_model_state(monkeypatch):
    """strategy="ddp", 2 processes: each rank holds the parameters, .grad plus DDP's buckets (a
    second copy: Lightning keeps gradient_as_bucket_view off) and AdamW's state, to the byte; rank 1
    received the log folder's broadcast and says it stood in for it."""
    monkeypatch.chdir(PROGRAMS)
    result = _predict_argv(["lightning_trainer.py", "--strategy", "ddp", "--devices", "2"], 2, ranks=(0, 1))
    params = sum(math.prod(s) for s in param_shapes()) * 4   # requested bytes
    for rank in (0, 1):
        state = live_at_end(result.rank(rank).prediction)
        assert (state.get("parameter"), state.get("gradient"), state.get("optimizer_state")) == (
            params, 2 * params, 2 * params), (rank, state)
    assert any("broadcast_object_list" in n["what"] for n in result.rank(1).prediction.notes)


def test_fsdp_strategy_under_torchrun_holds_each_ranks_flat_parameter_shard(monkeypatch):
    """strategy=FSDPStrategy(auto_wrap_policy={TransformerEncoderLayer}) (FSDP1, use_orig_params=True
    as Lightning sets it), 2 processes: a rank holds its shard of each unit's padded flat parameter
    (each parameter aligned to 16 bytes), its gradient shard as much and AdamW's two states of it."""
    monkeypatch.chdir(PROGRAMS)
    result = _predict_argv(["lightning_trainer.py", "--strategy", "fsdp", "--devices", "2"], 2, ranks=(0, 1))
    root = param_shapes()[:1] + param_shapes()[-2:]   # the embedding and the head: the root's unit
    units = [[math.prod(s) for s in block_shapes()]] * LAYERS + [[math.prod(s) for s in root]]
    shard = sum(padded_flat_numel(unit, 2, align=4) // 2 for unit in units) * 4
    for rank in (0, 1):
        state = live_at_end(result.rank(rank).prediction)
        assert (state.get("parameter"), state.get("gradient"), state.get("optimizer_state")) == (
            shard, shard, 2 * shard), (rank, state)


def test_a_one_process_prediction_of_two_devices_predicts_the_two_ranks(tmp_path):
    """`amem predict -- lightning_trainer.py --strategy ddp --devices 2` with no --nproc-per-node:
    the one-process prediction has one GPU, which Lightning refused ("You requested gpu: [0, 1] But
    your machine only has: [0]", reported as the script's failure). The job is predicted as the
    2 ranks it is, in one line that says why, each rank holding what torchrun's rank holds."""
    import json
    import sys

    from helpers import run_command

    out = tmp_path / "prediction.json"
    proc = run_command([sys.executable, "-m", "amem_alloc", "predict", "--policy", "torch",
                        "--json", str(out), "--", str(PROGRAMS / "lightning_trainer.py"), "--strategy", "ddp",
                        "--devices", "2"], timeout=400)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"Lightning is asked for 2 GPUs (devices=[0, 1], at {PROGRAMS / 'lightning_trainer.py'}:" in proc.stderr
    assert "--nproc-per-node 2" in proc.stderr and "But your machine only has" not in proc.stderr + proc.stdout
    data = json.loads(out.read_text())
    assert data["world_size"] == 2 and sorted(r["rank"] for r in data["ranks"]) == [0, 1]
    params = pf.storages(param_shapes())
    for rank in data["ranks"]:
        assert rank["policies"][0]["peak_allocated"] >= params * 5, rank["policies"][0]
