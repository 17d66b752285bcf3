"""What nvidia-smi will show (issue 36): the device total = a policy's peak reserved + what the
process holds outside the caching allocator (predict/context.py), line by line, and the verdict
taken on it.

* the model's lines from the H200 measurement (benchmarks/gpu_runs/h200-2026-11-27), per what a
  program used, and held against what 11 real programs held outside the allocator on that card;
* an MLP's device total from first principles under given context settings (the built-in
  measurement, eager loading, --context-mb, a calibration file), and its verdict, borderline
  where the total it needs is within the estimate's uncertainty of the card's.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from amem_alloc.predict import context, gpus
from amem_alloc.predict.context import MiB, Stack, Used

ROOT = Path(__file__).resolve().parent.parent
H200 = gpus.GPUS["H200"]
LAZY13 = Stack("lazy", "13.0")
TRAIN = Used(cuda=True, cublas=True, backward=True)


def _lines(out: context.Outside) -> dict[str, int]:
    return {p.name.split(" (")[0].split(",")[0]: p.nbytes >> 20 for p in out.parts}


# ============================================================================ the model
def test_a_training_step_on_the_measured_h200_is_context_cublas_and_kernels():
    out = context.outside_allocator(H200, TRAIN, LAZY13)
    assert _lines(out) == {"CUDA context": 518, "cuBLAS/cuBLASLt handles and kernels": 158,
                           "torch's kernels": 240 - 158}
    assert out.total == 758 * MiB and out.uncertainty == 16 * MiB
    assert {p.label for p in out.parts} == {"measured"} and "NVIDIA H200" in out.basis


def test_cudnn_adds_what_its_own_stage_holds_beyond_the_rest():
    trained = context.outside_allocator(H200, Used(cuda=True, cublas=True, cudnn=True, backward=True), LAZY13)
    assert trained.total == 758 * MiB                                     # 110 MiB alone < 240
    assert _lines(trained)["cuDNN handle and kernels"] == 0
    convs_only = context.outside_allocator(H200, Used(cuda=True, cudnn=True), LAZY13)
    assert convs_only.total == (518 + (188 - 158) + (110 - (188 - 158))) * MiB   # = context + the cudnn stage


def test_an_inference_loop_eager_loading_and_nccl():
    assert context.outside_allocator(H200, Used(cuda=True, cublas=True), LAZY13).total == (518 + 188) * MiB
    eager = context.outside_allocator(H200, TRAIN, Stack("eager", "13.0"))
    assert eager.total == (758 + 732) * MiB and eager.label == "estimated"
    assert eager.uncertainty == 16 * MiB + int(0.5 * eager.total)
    nccl = context.outside_allocator(H200, Used(cuda=True, cublas=True, backward=True, nccl=3), LAZY13)
    assert nccl.total == (758 + 262) * MiB
    assert any("2 more communicator" in n for n in nccl.not_counted)
    assert context.outside_allocator(H200, Used(), LAZY13).total == 0   # no CUDA: no context


def test_other_cards_and_stacks_take_the_measurement_as_an_estimate():
    a100 = context.outside_allocator(gpus.GPUS["A100-40GB"], TRAIN, LAZY13)
    assert a100.total == 758 * MiB and a100.label == "estimated"
    assert a100.uncertainty == 16 * MiB + int(0.25 * a100.total) and "another architecture" in a100.basis
    h100 = context.outside_allocator(gpus.GPUS["H100-80GB"], TRAIN, LAZY13)
    assert h100.uncertainty == 16 * MiB + int(0.10 * h100.total) and "same architecture" in h100.basis
    cuda12 = context.outside_allocator(H200, TRAIN, Stack("lazy", "12.8"))
    assert cuda12.label == "estimated" and "CUDA 12.8" in cuda12.basis
    assert Stack.here({"CUDA_MODULE_LOADING": "EAGER"}).module_loading == "eager"
    assert context._before_lazy("11.6") and not context._before_lazy("11.7")


# What each real program of the H200 run used (tests/programs; the run: predict_vs_real.json)
REAL_PROGRAMS = {
    "nanogpt": TRAIN, "nanogpt-compiled": TRAIN, "hf_trainer": TRAIN, "hf_llama_gqa": TRAIN,
    "fused_adamw": TRAIN, "compiled_step": TRAIN, "flex_attention_decoder": TRAIN,
    "resnet50_amp": Used(cuda=True, cublas=True, cudnn=True, backward=True),
    "resnet50_amp-cudnn-benchmark": Used(cuda=True, cublas=True, cudnn=True, backward=True),
    "detection_fasterrcnn": Used(cuda=True, cublas=True, cudnn=True, backward=True),
    "hf_generate": Used(cuda=True, cublas=True),
}


def test_the_model_against_what_real_programs_held_on_the_h200():
    real = json.loads((ROOT / "benchmarks/gpu_runs/h200-2026-11-27/predict_vs_real.json").read_text())["real"]
    errors = {}
    for name, used in REAL_PROGRAMS.items():
        held = real[name]["outside_allocator_end"]
        assert real[name]["device_total_peak"] == real[name]["peak_reserved"] + held   # what nvidia-smi listed
        out = context.outside_allocator(H200, used, LAZY13)
        errors[name] = (out.total - held) >> 20
        assert abs(out.total - held) <= out.uncertainty, (name, errors[name])
    assert min(errors.values()) == -6 and max(errors.values()) == 16, errors


def test_a_calibration_file_is_used_and_said(tmp_path):
    from amem_alloc import calibration

    entry = {"device": "NVIDIA A100-SXM4-40GB", "driver": "550.1", "torch": "2.11.0+cu128", "cuda": "12.8",
             "date": "2026-12-01", "context": 400 * MiB,
             "beyond_context": {"context_eager": 600 * MiB, "cublas": 100 * MiB, "cudnn": None,
                                "training_step": 150 * MiB, "nccl": 200 * MiB}}
    calibration._save(entry, tmp_path / "c.json")
    card = gpus.with_calibration(gpus.GPUS["A100-40GB"], tmp_path / "c.json")
    out = context.for_run(card, {"cuda": 1, "cublas": 1, "backward": 1, "cudnn": 1}, Stack("lazy", "12.8"))
    assert _lines(out) == {"CUDA context": 400, "cuBLAS/cuBLASLt handles and kernels": 100, "torch's kernels": 50,
                           "cuDNN handle and kernels": 0}
    assert out.label == "measured" and "your calibration" in out.basis and "550.1" in out.basis
    assert card.context == 550 * MiB                                 # the card's typical figure follows it
    assert gpus.with_calibration(H200, tmp_path / "c.json") is H200    # no entry for that card
    with pytest.raises(ValueError, match="no such calibration file"):
        gpus.with_calibration(H200, tmp_path / "missing.json")


def test_the_users_figure_replaces_the_model():
    card = gpus.with_context(H200, 900)
    out = context.for_run(card, {"cuda": 1, "cublas": 1, "backward": 1})
    assert out.total == 900 * MiB and out.uncertainty == 0 and out.label == "given"
    assert card.usable == H200.total_memory - 900 * MiB
    with pytest.raises(ValueError, match="--context-mb"):
        gpus.with_context(H200, -1)
    with pytest.raises(ValueError, match="not both"):
        gpus.with_context(gpus.custom(10), 100)
    assert context.for_run(gpus.custom(10), {"cuda": 1}).total == 0   # --capacity-gb: the usable memory itself


# ============================================================================ an MLP from first principles
torch = pytest.importorskip("torch")
import amem_alloc  # noqa: E402


def mlp_step():
    """Linear(4096, 4096, bias=False), fp32, a batch of 2048, SGD: every large request is its own
    segment but for the autograd thread's cuBLAS workspace, which takes y's freed 32 MiB."""
    model = torch.nn.Linear(4096, 4096, bias=False).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2048, 4096, device="cuda")
    model(x).sum().backward()
    opt.step()


# weight 64 + x 32 + cuBLAS workspace (sm_90: 32 MiB) 32 + y 32 (then the backward workspace) +
# grad 64 MiB, and one 2 MiB small segment for the loss and its gradient
MLP_RESERVED = (64 + 32 + 32 + 32 + 64 + 2) * MiB


@pytest.fixture(scope="module")
def mlp():
    return amem_alloc.predict(mlp_step, gpu="H200", policies="torch")


def test_the_mlps_device_total_from_first_principles(mlp):
    row = mlp.row("torch")
    assert row.peak_reserved == MLP_RESERVED
    assert mlp.run.libraries == {"cuda": 1, "cublas": 1, "backward": 1}
    d = mlp.to_dict()
    assert d["policies"][0]["device_total"] == MLP_RESERVED + 758 * MiB
    assert d["outside_allocator"]["bytes"] == 758 * MiB and d["gpu"]["context_bytes"] == 758 * MiB
    v = d["verdict"]["policies"][0]
    assert v["device_total"] == MLP_RESERVED + 758 * MiB
    assert v["device_total_needed"] == row.min_capacity + 758 * MiB
    assert v["fits"] and not v["borderline"] and v["says"].startswith("fits: ") and "(borderline" not in v["says"]
    assert row.headroom == H200.total_memory - (MLP_RESERVED + 758 * MiB)   # headroom on the device total


def test_the_mlp_under_eager_loading(monkeypatch):
    monkeypatch.setenv("CUDA_MODULE_LOADING", "EAGER")
    p = amem_alloc.predict(mlp_step, gpu="H200", policies="torch")
    assert p.to_dict()["policies"][0]["device_total"] == MLP_RESERVED + (758 + 732) * MiB


def test_the_mlp_with_a_given_context_and_a_borderline_card():
    p = amem_alloc.predict(mlp_step, gpu="H200", policies="torch", context_mb=1000)
    assert p.to_dict()["policies"][0]["device_total"] == MLP_RESERVED + 1000 * MiB
    need = p.row("torch").min_capacity
    spread = int(0.02 * p.row("torch").peak_reserved)          # the allocator's share; a given figure has none
    tight = (H200.total_memory - need - spread // 2) / MiB       # fits, by less than the uncertainty
    p = amem_alloc.predict(mlp_step, gpu="H200", policies="torch", context_mb=tight)
    v = p.to_dict()["verdict"]["policies"][0]
    assert v["fits"] and v["borderline"] and v["says"].startswith("fits: ") and v["says"].endswith(")") and "(borderline: within the ±" in v["says"]
    over = (H200.total_memory - need + spread // 2) / MiB          # misses, by less than the uncertainty
    v = amem_alloc.predict(mlp_step, gpu="H200", policies="torch", context_mb=over).to_dict()["verdict"]["policies"][0]
    assert not v["fits"] and v["borderline"] and v["says"].startswith("does not fit: ") and "(borderline: within the ±" in v["says"]
    far = (H200.total_memory - need - 4 * spread) / MiB
    v = amem_alloc.predict(mlp_step, gpu="H200", policies="torch", context_mb=far).to_dict()["verdict"]["policies"][0]
    assert v["fits"] and not v["borderline"]


def test_the_text_and_the_report_show_the_breakdown(mlp, tmp_path):
    text = amem_alloc.format_prediction(mlp)
    block = text[text.index("Device total ="):text.index("\n  torch ")]   # above the policy's verdict line, last
    assert "CUDA context (lazy loading)" in block and "518.00 MiB  measured" in block
    assert "outside the caching allocator" in block and "± 16.00 MiB" in block
    assert text.rstrip().endswith("device total 984.00 MiB of 139.80 GiB")   # 226 MiB reserved + 758
    page = amem_alloc.write_prediction_report(mlp, tmp_path / "r.html").read_text()
    assert page.count('class="outside-part"') == 3 and "device total" in page


# ============================================================================ a ResNet, cudnn.benchmark on and off
torchvision = pytest.importorskip("torchvision")
FWD, BWD_DATA, BWD_FILTER = "forward", "backward data", "backward filter"


def resnet_step(benchmark: bool):
    """torchvision's ResNet-18, batch 2 at 64x64, fp32, one SGD step; with cudnn.benchmark or not."""
    def step():
        torch.backends.cudnn.benchmark = benchmark
        try:
            model = torchvision.models.resnet18(num_classes=10).cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            x = torch.randn(2, 3, 64, 64, device="cuda")
            torch.nn.functional.cross_entropy(model(x), torch.zeros(2, dtype=torch.long, device="cuda")).backward()
            opt.step()
        finally:
            torch.backends.cudnn.benchmark = False
    return step


def _searches(p) -> list[tuple[str, int]]:
    return [(p.infos[key].op.rsplit(", ", 1)[-1], size) for kind, key, size, _ in p.ops
            if kind == 0 and "search workspace" in (p.infos[key].op or "")]


@pytest.mark.skipif(not torch.backends.cudnn.is_available(), reason="cuDNN's rules need a torch built with it")
def test_a_resnets_device_total_with_cudnn_benchmark_on_and_off():
    from amem_alloc import replay
    from amem_alloc.predict.rules import convolution

    off = amem_alloc.predict(resnet_step(False), gpu="H200", policies="torch")
    on = amem_alloc.predict(resnet_step(True), gpu="H200", policies="torch")
    for p in (off, on):   # cuBLAS (the fc layer), cuDNN (its convolutions and batch norms), a backward pass
        assert p.run.libraries == {"cuda": 1, "cublas": 1, "cudnn": 1, "backward": 1}
        assert p.to_dict()["policies"][0]["device_total"] == p.row("torch").peak_reserved + 758 * MiB
    assert not _searches(off) and not any(op[0] == replay.RELEASE for op in off.ops)
    # ResNet-18's distinct convolutions: conv1, layer1's 3x3 (4 alike), and per later stage its
    # strided 3x3, its 3x3 (3 alike) and its 1x1 downsample: 1 + 1 + 3 * 3 = 11 forward; backward
    # each filter gradient, and every data gradient but conv1's (the image needs none)
    kinds = [k for k, _ in _searches(on)]
    assert (kinds.count(FWD), kinds.count(BWD_DATA), kinds.count(BWD_FILTER)) == (11, 10, 11)
    assert sum(op[0] == replay.RELEASE for op in on.ops) == 32   # each search empties the cache
    conv1 = 4 * (2 * 3 * 64 * 64 + 2 * 64 * 32 * 32 + 64 * 3 * 7 * 7)   # x + y + w, fp32
    assert _searches(on)[0] == (FWD, convolution.SEARCH_FACTOR * conv1)
    assert on.row("torch").device_mallocs > off.row("torch").device_mallocs   # segments made again after each release
    assert any("cuDNN benchmark search workspace" in n["what"] for n in on.notes)


@pytest.mark.parametrize("destroyed", [False, True])
def test_a_ddp_rank_holds_nccls_communicator(destroyed, monkeypatch):
    """Also when the script destroys its process group itself before it ends (nanoGPT does): the
    communicator was there while it trained."""
    monkeypatch.setenv("DESTROY", "1" if destroyed else "0")
    from amem_alloc.predict.distributed import launch as launch_mod
    from amem_alloc.predict.distributed.ranks import predict_ranks

    script = str(Path(__file__).parent / "predict_models" / "dist_ddp.py")
    result = predict_ranks(launch_mod.Launch(2, 1, (0,)), [script], "H200", "torch", steps=0, timeout=300, workers=1)
    rank = result.ranks[0].prediction   # (steps=0: the script runs to its end, its destroy included)
    assert rank.run.libraries.get("nccl") == 1          # init_process_group's one group
    parts = {p["part"]: p["bytes"] for p in rank.to_dict()["outside_allocator"]["parts"]}
    assert parts["NCCL: its kernels and first communicator"] == 262 * MiB
    assert rank.to_dict()["outside_allocator"]["bytes"] == (758 + 262) * MiB
    assert any("NCCL's buffers for each peer" in n for n in rank.to_dict()["outside_allocator"]["not_counted"])


def test_a_captured_graph_is_said_not_counted_beyond_its_pool():
    def step():
        x = torch.randn(1024, 1024, device="cuda")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x @ x
        g.replay()
        return y
    p = amem_alloc.predict(step, gpu="H200", policies="torch")
    assert p.run.libraries.get("graphs") == 1
    assert any("instantiated CUDA graph" in n for n in p.to_dict()["outside_allocator"]["not_counted"])
    assert not any("CUDA graph" in n for n in mlp_outside().not_counted)


def mlp_outside() -> context.Outside:
    return context.outside_allocator(H200, TRAIN, LAZY13)
