"""Distributed jobs under prediction (amem_alloc/predict/distributed): torchrun's shape and
environment, torch's fake process group, DDP, FSDP2 and FSDP1 model state per rank against first
principles (bytes of parameters, optimizer state, DDP buckets, FSDP1's padded flat parameters),
equal ranks analysed once, the per-rank outputs of `amem predict -- torchrun ...`."""
import functools
import json
import os
import re
import sys
from pathlib import Path
from unittest import mock

import pytest

from helpers import run_command

torch = pytest.importorskip("torch")

from amem_alloc.predict.distributed import launch as launch_mod  # noqa: E402
from amem_alloc.predict.distributed.environment import RankEnvironment  # noqa: E402
from amem_alloc.predict.distributed.ranks import predict_ranks  # noqa: E402
from amem_alloc.replay import ALLOC, FREE  # noqa: E402
import compiled_reference  # noqa: E402
import program_figures as pf  # noqa: E402

MODELS = Path(__file__).parent / "predict_models"
WIDTH, LAYERS = 1024, 4
PARAM_BYTES = LAYERS * (WIDTH * WIDTH + WIDTH) * 4   # fp32 weights and biases of the test models


def live_at_end(prediction) -> dict[str, int]:
    """Requested bytes of the CUDA storages live at the last optimizer step's end, by category."""
    return live_at(prediction, [i for i, name in prediction.markers if name == "step"][-1])


def live_at(prediction, op: int) -> dict[str, int]:
    """Requested bytes of the CUDA storages live before the program's op `op`, by category."""
    live = {}
    for kind, key, size, _ in prediction.ops[:op]:
        if kind == ALLOC:
            live[key] = size
        elif kind == FREE:
            live.pop(key, None)
    out: dict[str, int] = {}
    for key, size in live.items():
        category = prediction.infos[key].category
        if prediction.infos[key].op != "cublas_workspace":
            out[category] = out.get(category, 0) + size
    return out


def _predict(script: str, world: int, ranks=(0,), env=None):
    return _predict_argv([str(MODELS / script)], world, ranks, env)


def _predict_argv(argv: list[str], world: int, ranks=(0,), env=None):
    launch = launch_mod.Launch(world, 1, ranks)
    with mock.patch.dict(os.environ, env or {}):
        return predict_ranks(launch, argv, "H100", "torch", steps=5, timeout=300)


# ---------------------------------------------------------------------------- the job's shape
def test_torchrun_command_line_gives_the_shape_and_the_script():
    launch, script = launch_mod.parse_torchrun(
        ["torchrun", "--standalone", "--nnodes=2", "--nproc-per-node", "4", "--master-port", "1234",
         "train.py", "--lr", "1"])
    assert (launch.nnodes, launch.nproc_per_node, launch.world_size, launch.master_port) == (2, 4, 8, 1234)
    assert script == ["train.py", "--lr", "1"] and launch.chosen() == list(range(8))
    launch, script = launch_mod.parse_torchrun(["python", "-m", "torch.distributed.run", "--nproc_per_node=2",
                                                "t.py"], rank="1")
    assert (launch.world_size, launch.chosen(), script) == (2, [1], ["t.py"])


def test_torchrun_runs_a_module_as_python_m_does():
    launch, script = launch_mod.parse_torchrun(["torchrun", "--nproc_per_node=2", "--rdzv_backend", "c10d",
                                                "--local-ranks-filter", "0", "--tee", "3", "-m", "pkg.train",
                                                "--module", "llama3"])
    assert (launch.world_size, script) == (2, ["-m", "pkg.train", "--module", "llama3"])


@pytest.mark.parametrize("argv, needle", [
    (["torchrun", "--nproc-per-node", "gpu", "t.py"], "whole number"),
    (["torchrun", "--nnodes", "1:4", "t.py"], "elastic"),
    (["torchrun", "-m"], "no script"),
    (["torchrun", "--nproc-per-node", "2"], "no script"),
])
def test_torchrun_shapes_prediction_cannot_take_are_one_line_errors(argv, needle):
    with pytest.raises(ValueError, match=needle):
        launch_mod.parse_torchrun(argv)


def test_rank_environment_is_torchruns_and_is_restored():
    os.environ.pop("LOCAL_RANK", None)
    with RankEnvironment(launch_mod.Launch(4, 2), 6):
        seen = {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")}
    assert seen == {"RANK": "6", "LOCAL_RANK": "2", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1"}
    assert "LOCAL_RANK" not in os.environ


# ---------------------------------------------------------------------------- model state, first principles
@pytest.fixture(scope="module")
def fsdp2_rank0():
    return _predict("dist_fsdp2.py", 4).rank(0).prediction


def test_fsdp2_model_state_per_rank_is_the_shard_of_params_and_adam_state(fsdp2_rank0):
    world = 4
    state = live_at_end(fsdp2_rank0)
    assert state.get("parameter") == PARAM_BYTES // world
    assert state.get("gradient") == PARAM_BYTES // world              # the reduce-scattered shard
    assert state.get("optimizer_state") == 2 * PARAM_BYTES // world   # exp_avg, exp_avg_sq (step on the CPU)


def test_fsdp2_gathered_parameters_are_labelled_as_parameters(fsdp2_rank0):
    p = fsdp2_rank0
    gathered = [size for kind, key, size, _ in p.ops if kind == ALLOC and p.infos[key].category == "parameter (gathered)"]
    # each is one whole parameter all-gathered from its 4 shards: a Linear's weight or its bias
    assert sorted(set(gathered)) == [WIDTH * 4, WIDTH * WIDTH * 4]
    # every unshard gathers both, in forward and again in backward (reshard_after_forward), 3 steps
    assert gathered.count(WIDTH * 4) == gathered.count(WIDTH * WIDTH * 4) == LAYERS * 2 * 3
    at_peak = {p.infos[k].category for k in p.at_peak.live if p.infos[k].op != "cublas_workspace"}
    assert "parameter (gathered)" in at_peak and "workspace" not in at_peak


def test_fsdp2_cpu_offload_keeps_sharded_model_state_off_the_gpu():
    """CPUOffloadPolicy: the sharded parameters, their gradients and AdamW's state live on the CPU;
    only the gathered parameters (and the gradients on their way to the CPU) transit the GPU."""
    p = _predict("dist_fsdp2.py", 4, env={"OFFLOAD": "1"}).rank(0).prediction
    assert live_at_end(p) == {}   # no parameter, gradient or optimizer-state bytes on the GPU
    state = {"parameter", "gradient", "optimizer_state"}
    assert not any(p.infos[key].category in state for kind, key, _, _ in p.ops if kind == ALLOC)
    gathered = [size for kind, key, size, _ in p.ops if kind == ALLOC and p.infos[key].category == "parameter (gathered)"]
    assert gathered.count(WIDTH * 4) == gathered.count(WIDTH * WIDTH * 4) == LAYERS * 2 * 3   # as without offload


@pytest.mark.slow
def test_fsdp2_model_state_shrinks_as_one_over_n():
    for world in (1, 2, 4, 8):
        state = live_at_end(_predict("dist_fsdp2.py", world).rank(0).prediction)
        assert (state.get("parameter"), state.get("optimizer_state")) == (PARAM_BYTES // world,
                                                                          2 * PARAM_BYTES // world), world


def ddp_buckets(param_bytes: list[int], first_cap: int = 1 << 20, cap: int = 25 << 20) -> list[int]:
    """Bytes of DDP's rebuilt buckets: parameters in gradient-ready order (reverse of registration
    for a Sequential), a bucket closed once it reaches its cap, the first cap 1 MiB, then 25 MiB
    (torch/nn/parallel/distributed.py, reducer.cpp)."""
    buckets, current = [], 0
    for nbytes in reversed(param_bytes):
        current += nbytes
        if current >= (first_cap if not buckets else cap):
            buckets.append(current)
            current = 0
    return buckets + ([current] if current else [])


def _bucket_allocations(prediction) -> list[int]:
    return [size for kind, key, size, _ in prediction.ops
            if kind == ALLOC and prediction.infos[key].op == "empty.memory_format"
            and prediction.infos[key].category == "gradient"]


@pytest.mark.parametrize("grad_view", [False, True])
def test_ddp_model_state_is_params_grads_buckets_and_adam_state(grad_view):
    prediction = _predict("dist_ddp.py", 2, env={"GRAD_VIEW": "1" if grad_view else "0"}).rank(0).prediction
    state = live_at_end(prediction)
    assert state.get("parameter") == PARAM_BYTES and state.get("optimizer_state") == 2 * PARAM_BYTES
    # the gradient buckets hold one copy of the gradients; without gradient_as_bucket_view the
    # .grad tensors are a second copy, with it they are views into the buckets
    assert state.get("gradient") == (1 if grad_view else 2) * PARAM_BYTES, state
    assert sum(state.values()) == (4 if grad_view else 5) * PARAM_BYTES, state
    # one bucket of everything at construction, rebuilt after the first iteration in ready order
    layer = [WIDTH * WIDTH * 4, WIDTH * 4]
    assert _bucket_allocations(prediction) == [PARAM_BYTES] + ddp_buckets(layer * LAYERS)
    assert ddp_buckets(layer * LAYERS) == [WIDTH * 4 + WIDTH * WIDTH * 4, 3 * (WIDTH * 4 + WIDTH * WIDTH * 4)]


@pytest.mark.parametrize("hook", ["allreduce", "fp16"])
def test_a_scripts_own_ddp_comm_hook_is_the_one_that_runs(hook):
    """torch's default_hooks registered by the script: amem's in-place hook stays out of the way,
    and fp16_compress_hook's half-precision copy of each bucket (`buffer.to(float16)`, all-reduced)
    is allocated, once per bucket per iteration: the first iteration's single bucket, then the two
    rebuilt ones in iterations 2 and 3."""
    prediction = _predict("dist_ddp.py", 2, env={"HOOK": hook}).rank(0).prediction
    state = live_at_end(prediction)
    assert state.get("parameter") == PARAM_BYTES and state.get("gradient") == 2 * PARAM_BYTES, state
    layer = [WIDTH * WIDTH * 4, WIDTH * 4]
    rebuilt = ddp_buckets(layer * LAYERS)
    allocated = [size for kind, _, size, _ in prediction.ops if kind == ALLOC]
    halves = {PARAM_BYTES // 2: 1, rebuilt[0] // 2: 2, rebuilt[1] // 2: 2}
    expected = halves if hook == "fp16" else dict.fromkeys(halves, 0)
    assert {h: allocated.count(h) for h in halves} == expected


def test_equal_ranks_are_recorded_each_and_analysed_once():
    result = _predict("dist_fsdp2.py", 2, ranks=None)
    assert [(r.rank, r.same_as) for r in result.ranks] == [(0, None), (1, 0)]
    assert result.worst.rank == 0 and result.to_dict()["ranks"][1]["same_as"] == 0


UNEVEN = """
import os, sys, torch, torch.distributed as dist
dist.init_process_group("nccl")
rank = dist.get_rank()
if rank == int(os.environ.get("FAIL_RANK", "-1")):
    sys.exit(7)
kept = torch.empty((rank + 1) << 26, dtype=torch.uint8, device="cuda")   # (rank + 1) x 64 MiB
torch.nn.Linear(64, 64, device="cuda")(torch.randn(4, 64, device="cuda")).sum().backward()
"""


def _uneven(tmp_path, world: int, workers: int, env=None):
    script = tmp_path / "uneven.py"
    script.write_text(UNEVEN)
    with mock.patch.dict(os.environ, env or {}):
        return predict_ranks(launch_mod.Launch(world, 1, None), [str(script)], "H100", "torch", steps=1,
                             timeout=120, workers=workers)


def test_ranks_recorded_in_worker_processes_are_each_ranks_own_program(tmp_path):
    # rank 0 recorded here (backward included), ranks 1 and 2 in two workers forked after it
    parallel = _uneven(tmp_path, 3, workers=2)
    assert [(r.rank, r.same_as) for r in parallel.ranks] == [(0, None), (1, None), (2, None)]
    for r in parallel.ranks:   # each rank's own allocation, in rank order
        assert max(size for kind, _, size, _ in r.prediction.ops if kind == ALLOC) == (r.rank + 1) << 26
    serial = _uneven(tmp_path, 3, workers=1)
    assert [r.prediction.ops for r in serial.ranks] == [r.prediction.ops for r in parallel.ranks]
    assert parallel.worst.rank == 2


SAVING = """
import os, sys, torch, torch.distributed as dist
dist.init_process_group("nccl")
rank, out = dist.get_rank(), sys.argv[1]
if rank == 0:
    os.makedirs(os.path.join(out, "checkpoint-1"))
    torch.save(torch.nn.Linear(64, 64, device="cuda").state_dict(), os.path.join(out, "checkpoint-1", "model.pt"))
dist.barrier()
found = os.path.exists(os.path.join(out, "checkpoint-1", "model.pt"))
torch.save({"shard": torch.zeros(4, device="cuda")}, os.path.join(out, f"shard-{rank}.pt"))
kept = torch.empty((64 if found else 1) << 20, dtype=torch.uint8, device="cuda")
"""


def test_every_rank_finds_what_rank_0_saved_and_nothing_saved_stays(tmp_path):
    """Files saved from fake tensors go when the whole prediction ends (saved_files.py): ranks 1
    and 2, recorded after rank 0 (in worker processes), find its checkpoint as in the real run,
    and neither its folder nor the shards the workers saved are left."""
    script, out = tmp_path / "saving.py", tmp_path / "out"
    script.write_text(SAVING)
    out.mkdir()
    result = predict_ranks(launch_mod.Launch(3, 1, launch_mod.parse_ranks("all", 3)), [str(script), str(out)],
                           "H100", "torch", steps=1, timeout=120, workers=2)
    assert [max(size for kind, _, size, _ in r.prediction.ops if kind == ALLOC) for r in result.ranks] == [64 << 20] * 3
    assert os.listdir(out) == []


SYMMETRIC = """
import torch, torch.distributed as dist
dist.init_process_group("nccl")
kept = torch.empty(1 << 26, dtype=torch.uint8, device="cuda")   # 64 MiB on every rank
"""


def test_a_symmetric_job_records_its_first_and_last_rank_and_takes_the_rest_as_rank_0(tmp_path):
    """symmetry.py: ranks 0 and 5 record the same program, so 1-4 are rank 0's, not recorded; a job
    whose ends differ (each rank keeps (rank + 1) x 64 MiB) records every rank."""
    script = tmp_path / "symmetric.py"
    script.write_text(SYMMETRIC)
    result = predict_ranks(launch_mod.Launch(6, 1, None), [str(script)], "H100", "torch", steps=1, timeout=120)
    assert [(r.rank, r.same_as, r.recorded) for r in result.ranks] == [
        (0, None, True), (1, 0, False), (2, 0, False), (3, 0, False), (4, 0, False), (5, 0, True)]
    data = result.to_dict()
    assert "ranks 0 and 5 recorded the same program" in data["not_recorded_because"]
    from amem_alloc.report.prediction_text import format_ranks
    text = format_ranks(result)
    assert "6 predicted (2 recorded)" in text and "1-4" in text and "0 (not recorded)" in text
    uneven = _uneven(tmp_path, 4, workers=2)
    assert all(r.recorded and r.same_as is None for r in uneven.ranks) and not uneven.not_recorded_because
    named = predict_ranks(launch_mod.Launch(4, 1, launch_mod.parse_ranks("all", 4)), [str(script)], "H100",
                          "torch", steps=1, timeout=120)
    assert all(r.recorded for r in named.ranks) and len(named.ranks) == 4


def test_a_rank_failing_in_a_worker_fails_the_prediction_with_its_status(tmp_path):
    from amem_alloc.user_script import ScriptFailed

    with pytest.raises(ScriptFailed) as failed:
        _uneven(tmp_path, 3, workers=2, env={"FAIL_RANK": "1"})
    assert failed.value.status == 7 and "exited with status 7" in str(failed.value)


def test_a_worker_that_dies_leaves_its_rank_to_be_recorded_here():
    from amem_alloc.predict.distributed import recording
    from amem_alloc.predict.run import RecordedRun

    parent = os.getpid()

    def record(rank):
        if rank == 2 and os.getpid() != parent:
            os._exit(1)   # the worker crashes without answering
        return recording.Recording(rank, RecordedRun(f"rank {rank}", [(ALLOC, 1, rank + 1, 0)], {}, []), 0)

    got = list(recording.record_all([0, 1, 2, 3], record, workers=2))
    assert [(r.rank, r.run.ops[0][2]) for r in got] == [(0, 1), (1, 2), (2, 3), (3, 4)]


DYING_MID_ANSWER = """
import os, time
from amem_alloc.predict.distributed import recording
from amem_alloc.predict.run import RecordedRun

parent, answered_large = os.getpid(), []

def record(rank):
    if os.getpid() != parent:
        if answered_large:
            os._exit(1)   # the worker that just answered the large recording dies at its next rank
        if rank == 1:
            answered_large.append(rank)
        else:
            time.sleep(0.5)   # the other worker answers after that death
    ops = [(0, 1, rank + 1, 0)] * (400_000 if rank == 1 else 1)
    return recording.Recording(rank, RecordedRun(f"rank {rank}", ops, {}, []), 0)

got = list(recording.record_all([0, 1, 2, 3, 4], record, workers=3, together=True))
print([(r.rank, len(r.run.ops)) for r in got])
"""


def test_a_worker_dying_just_after_a_large_answer_leaves_no_one_waiting():
    """A worker answered a large recording, then died at its next rank, while another worker still
    had answers to give: every rank's recording arrives whole, the dead worker's next rank recorded
    here. (The workers answer on pipes of their own; with one shared queue a worker was once seen
    waiting for ever at its exit for the queue's writer thread, and this process for it.)"""
    proc = run_command([sys.executable, "-c", DYING_MID_ANSWER], timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[(0, 1), (1, 400000), (2, 1), (3, 1), (4, 1)]", proc.stdout


# ---------------------------------------------------------------------------- the command
def test_amem_predict_torchrun_writes_ranks_json_and_one_trace_per_rank(tmp_path):
    """JSON with every rank, one trace per rank, and one report: the worst rank's page with the
    ranks side by side (their peaks as the JSON gives them)."""
    out, page = tmp_path / "p.json", tmp_path / "report.html"
    proc = run_command([sys.executable, "-m", "amem_alloc", "predict", "--policy", "torch", "--json", str(out),
                        "--trace", str(tmp_path / "t{rank}.pickle"), "--report", str(page), "--", "torchrun",
                        "--nproc-per-node", "2", str(MODELS / "dist_pipeline.py")], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert [r["rank"] for r in data["ranks"]] == [0, 1] and data["world_size"] == 2
    assert (tmp_path / "t0.pickle").is_file() and (tmp_path / "t1.pickle").is_file()
    assert f"worst rank: {data['worst_rank']}" in proc.stdout
    html = page.read_text()
    assert "2 ranks side by side" in html and "Verdict" in html
    from amem_alloc.introspection import format_bytes
    for r in data["ranks"]:   # the pipeline's two stages differ: each rank's own peak is on the page
        assert f"rank {r['rank']}" in html and format_bytes(r["policies"][0]["peak_allocated"]) in html


NO_SET_DEVICE = """import os, torch, torch.distributed as dist
dist.init_process_group("nccl")
{set_device}m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256).cuda())
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(2):
    m(torch.randn(8, 256, device="cuda")).sum().backward(); opt.step(); opt.zero_grad()
"""


@pytest.mark.parametrize("sets_device", [False, True])
def test_ranks_of_a_node_left_on_cuda_0_are_said_in_the_text(tmp_path, sets_device):
    """pytorch/examples' imagenet under torchrun without --gpu sets no device: every rank runs on
    cuda:0, which NCCL refuses ("Duplicate GPU detected"); it was predicted as if each rank had its
    own GPU, with nothing said. The rank's note is in the text too, above the worst rank's own
    prediction (rank 0's, which has it not)."""
    script = tmp_path / "ddp.py"
    script.write_text(NO_SET_DEVICE.format(
        set_device='torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))\n' if sets_device else ""))
    out = tmp_path / "p.json"
    proc = run_command([sys.executable, "-m", "amem_alloc", "predict", "--policy", "torch", "--json", str(out),
                        "--", "torchrun", "--nproc-per-node", "2", str(script)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ranks = {r["rank"]: [n["what"] for n in r["notes"] if "makes its collectives on cuda:0" in n["what"]]
             for r in json.loads(out.read_text())["ranks"]}
    if sets_device:
        assert ranks == {0: [], 1: []} and "notes of other ranks" not in proc.stdout
        return
    assert ranks[0] == [] and len(ranks[1]) == 1 and ranks[1][0].startswith("local rank 1 makes its collectives")
    text = proc.stdout
    assert text.index("notes of other ranks (not in rank 0's below):") < text.index("worst rank: 0")
    assert "  not-modelled: local rank 1 makes its collectives on cuda:0" in text and "(rank 1)" in text


def test_a_trace_path_without_rank_is_refused_for_several_ranks(tmp_path):
    proc = run_command([sys.executable, "-m", "amem_alloc", "predict", "--nproc-per-node", "2", "--trace",
                        str(tmp_path / "t.pickle"), "--", "python", str(MODELS / "dist_fsdp2.py")], timeout=120)
    assert proc.returncode == 2 and "{rank}" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("option", [["--steps", "-3"], ["--timeout", "-1"], ["--json", "/no/such/folder/p.json"]])
def test_a_distributed_prediction_checks_the_run_options_as_one_process_does(option):
    proc = run_command([sys.executable, "-m", "amem_alloc", "predict", "--nproc-per-node", "2", *option, "--",
                        "python", str(MODELS / "dist_fsdp2.py")], timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and option[0].lstrip("-") in proc.stderr


def test_nanogpt_under_torchrun_holds_its_ddp_model_state_on_every_rank(tmp_path, monkeypatch):
    """nanoGPT's own train.py (vendored unchanged) as `torchrun --nproc_per_node=2` runs it: its DDP
    path (init_process_group("nccl"), DDP(device_ids=[local rank]), no_sync through
    require_backward_grad_sync) on the fake group. At the last optimizer step each rank holds the
    parameters, their .grad tensors and DDP's buckets (a second copy: gradient_as_bucket_view is
    off), and fused AdamW's two states and step count per parameter, to the byte; rank 0 (the
    master process: it evaluates) and rank 1 are different programs."""
    monkeypatch.chdir(pf.nanogpt_workdir(tmp_path))
    argv = ["train.py", "config/train_shakespeare_char.py", "--max_iters=2", "--eval_iters=1", "--eval_interval=1",
            "--compile=False", "--gradient_accumulation_steps=2", "--batch_size=4", "--block_size=64"]
    result = _predict_argv(argv, 2, ranks=(0, 1))
    shapes = pf.nanogpt_param_shapes(n_layer=6, n_embd=384, vocab_size=65, block_size=64)
    params = pf.storages(shapes)
    for rank in (0, 1):
        state = live_at_end(result.rank(rank).prediction)
        assert (state.get("parameter"), state.get("gradient"), state.get("optimizer_state")) == (
            params, 2 * params, 2 * params + 4 * len(shapes)), (rank, state)   # requested: 4 B per step count
    assert result.rank(1).same_as is None


def _kib_events(prediction) -> list[str]:
    """The program's allocations and frees as "+N"/"-N" (KiB), cuBLAS workspaces left out."""
    sizes, events = {}, []
    for kind, key, size, _ in prediction.ops:
        if prediction.infos[key].op == "cublas_workspace":
            continue
        if kind == ALLOC:
            sizes[key] = size
        events.append(("+" if kind == ALLOC else "-") + str(sizes[key] // 1024))
    return events


def _between(events: list[str], start: str, end: str) -> list[str]:
    return events[events.index(start) + 1:events.index(end)]


@pytest.mark.parametrize("avoid_record_streams", ["0", "1"])
def test_collectives_allocate_and_hold_as_nccl_does(avoid_record_streams):
    """tests/predict_models/dist_collectives.py (4 ranks; each tensor's size in KiB names it, marks
    of 901-913 KiB between steps): the rules of collectives.py, event by event, the same with
    TORCH_NCCL_AVOID_RECORD_STREAMS=1 (stashing instead of recordStream: the same lifetimes)."""
    prediction = _predict("dist_collectives.py", 4, env={"TORCH_NCCL_AVOID_RECORD_STREAMS": avoid_record_streams}
                          ).rank(0).prediction
    ev = _kib_events(prediction)
    # synchronous all_reduce: nothing held, nothing allocated beyond the tensor
    assert ev[:ev.index("+901")] == ["+11", "-11"]
    # async all_reduce: the tensor outlives `del` while the work (its outputs) lives; after
    # work.wait() and `del work` it is freed at once
    assert _between(ev, "+901", "+903") == ["-901", "+13", "+902", "-902", "-13"]
    # list-form all_gather: one flat buffer of world x 17 KiB for the call (newLikeFlat)
    assert _between(ev, "-903", "+904") == ["+17"] * 5 + ["+68", "-68"] + ["-17"] * 5
    # list-form reduce_scatter: one flat buffer of world x 19 KiB
    assert _between(ev, "-904", "+905") == ["+19"] * 5 + ["+76", "-76"] + ["-19"] * 5
    # functional all_gather: its output once (wait_tensor and the autograd wrapper return it, not
    # a copy); the input held on the NCCL stream until wait_tensor
    assert _between(ev, "-905", "+906") == ["+23", "+92", "+911", "-911", "-23", "-92"]
    # broadcast and all_to_all_single: the script's own tensors only
    assert _between(ev, "-906", "+907") == ["+29", "+29", "-29", "-29"]
    # batch_isend_irecv: send and receive buffers held for NCCL until their works are waited
    assert _between(ev, "-907", "+909") == ["+31", "+37", "+908", "-908", "-31", "-37"]
    # a use that is over (waited) holds nothing, unless more was queued on the stream since
    assert _between(ev, "-909", "+913") == ["+41", "+43", "+912", "-912", "-41", "-43"]


def test_hf_trainer_with_fsdp2_holds_each_ranks_shard_of_the_model_state(monkeypatch):
    """transformers' Trainer with `fsdp=True` (FSDP2 through accelerate, GPT-2 blocks wrapped) under
    torchrun with 2 processes (tests/programs/hf_trainer.py --fsdp): each rank holds its shard of
    every parameter (dim 0 split in 2, as fully_shard pads it), of their gradients and of fused
    AdamW's two states (accelerate hands the optimizer the shards by matching data_ptr(), so fake
    tensors need distinct addresses), plus a 4-byte step count per parameter."""
    pytest.importorskip("transformers")
    import math

    from transformers import GPT2Config, GPT2LMHeadModel

    monkeypatch.chdir(Path(__file__).parent / "programs")
    result = _predict_argv(["hf_trainer.py", "--bf16", "--fsdp"], 2, ranks=(0, 1))
    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=128,
                                           bos_token_id=999, eos_token_id=999))
    params = list(model.parameters())
    shard = sum(math.ceil(p.shape[0] / 2) * math.prod(p.shape[1:]) * 4 for p in params)
    for rank in (0, 1):
        state = live_at_end(result.rank(rank).prediction)
        assert (state.get("parameter"), state.get("gradient"), state.get("optimizer_state")) == (
            shard, shard, 2 * shard + 4 * len(params)), (rank, state)


def test_pipeline_stages_hold_their_model_state_and_the_schedules_buffers():
    """ScheduleGPipe over 2 ranks (tests/predict_models/dist_pipeline.py, full static metadata): each
    rank holds its stage's parameters, gradients and AdamW state; beside them, at the last optimizer
    step, the batch it fed, the example micro-batch, one receive buffer per micro-batch
    (stage.py `_create_act_recv_info` on the last stage, `_create_grad_recv_info` on the first, both
    `_make_tensor_from_meta`), and on the last stage the micro-batch outputs it keeps to merge
    (`output_chunks`, cleared at the next step)."""
    stage_bytes = 2 * (WIDTH * WIDTH + WIDTH) * 4
    batch, micro, microbatches = 32 * WIDTH * 4, 8 * WIDTH * 4, 4
    result = _predict("dist_pipeline.py", 2, ranks=(0, 1))
    for rank in (0, 1):
        state = live_at_end(result.rank(rank).prediction)
        assert (state.get("parameter"), state.get("gradient"), state.get("optimizer_state")) == (
            stage_bytes, stage_bytes, 2 * stage_bytes), rank
        kept_outputs = microbatches * micro if rank == 1 else 0
        assert state.get("activation") == batch + micro + microbatches * micro + kept_outputs, (rank, state)


# ---------------------------------------------------------------------------- FSDP1 (flat parameters)
F1_WIDTH, F1_HIDDEN, F1_LAYERS = 1000, 1001, 4   # tests/predict_models/dist_fsdp1.py
F1_BLOCK = [F1_WIDTH * F1_HIDDEN, F1_HIDDEN, F1_HIDDEN * F1_WIDTH, F1_WIDTH]   # fc1 weight, bias; fc2 weight, bias
F1_NORM = [F1_WIDTH, F1_WIDTH]                                                 # the root's LayerNorm
F1_UNITS = {"transformer": [F1_BLOCK] * F1_LAYERS + [F1_NORM],                 # each block a unit
            "size": [F1_BLOCK[:2], F1_BLOCK[2:]] * F1_LAYERS + [F1_NORM]}      # each Linear a unit


def padded_flat_numel(numels: list[int], world: int, align: int = 0) -> int:
    """Elements of FSDP1's padded unsharded flat parameter (torch/distributed/fsdp/_flat_param.py,
    `_init_flat_param_and_metadata`, `_get_shard`): the parameters one after the other, each
    starting at a 16-byte boundary under use_orig_params (`align` elements: 16 / the forward
    dtype's size), the total padded to a multiple of the world size; a rank holds 1/world of it."""
    total = 0
    for numel in numels:
        total += (-total) % align if align else 0
        total += numel
    return total + (-total) % world


def fsdp1_shard_bytes(world: int, wrap: str = "transformer", align: int = 0) -> int:
    return sum(padded_flat_numel(unit, world, align) // world for unit in F1_UNITS[wrap]) * 4


def _gathered(prediction) -> list[tuple[int, int]]:
    """(bytes, stream) of every allocation categorised as a gathered (unsharded) parameter."""
    return [(size, stream) for kind, key, size, stream in prediction.ops
            if kind == ALLOC and prediction.infos[key].category == "parameter (gathered)"]


@functools.lru_cache(maxsize=None)
def fsdp1_full_shard(world: int):
    return _predict("dist_fsdp1.py", world).rank(0).prediction


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp1_model_state_per_rank_is_the_flat_parameters_shard(world):
    """FULL_SHARD, transformer_auto_wrap_policy: each rank holds its shard of every padded flat
    parameter, the gradient shard as much, AdamW twice as much; each unshard refills the padded
    unsharded flat parameter (fp32) on FSDP1's unshard stream, live at the peak."""
    p = fsdp1_full_shard(world)
    shard = fsdp1_shard_bytes(world)
    assert live_at_end(p) == {"parameter": shard, "gradient": shard, "optimizer_state": 2 * shard}
    block = padded_flat_numel(F1_BLOCK, world) * 4
    unshards = [stream for size, stream in _gathered(p) if size == block and stream != 0]
    # every block is gathered in forward and again in backward (resharded after forward), 3 steps
    assert len(unshards) == F1_LAYERS * 2 * 3 and len(set(unshards)) == 1
    reduced = {stream for kind, key, size, stream in p.ops if kind == ALLOC and p.infos[key].category == "gradient"}
    assert reduced and 0 not in reduced and not reduced & set(unshards)   # the post-backward stream's
    # at the peak (backward of the first block): every shard and AdamW state, and two padded
    # unsharded flat parameters, the block's and the root's (the root is not resharded after forward)
    at_peak = live_at(p, p.at_peak.op + 1)
    assert (at_peak["parameter"], at_peak["optimizer_state"]) == (shard, 2 * shard)
    assert at_peak["parameter (gathered)"] == block + padded_flat_numel(F1_NORM, world) * 4


def test_fsdp1_model_state_shrinks_as_one_over_n():
    two, four = (sum(live_at_end(fsdp1_full_shard(world)).values()) for world in (2, 4))
    assert two == 4 * fsdp1_shard_bytes(2) and four == 4 * fsdp1_shard_bytes(4)
    assert abs(two / four - 2) < 1e-4


def test_fsdp1_mixed_precision_gathers_bf16_with_orig_params_aligned():
    """MixedPrecision(bf16) with use_orig_params: parameters aligned to 16 bytes of bf16 (8
    elements) in the flat parameter; the fp32 shard, gradient and AdamW state are kept; each unshard
    gathers a bf16 copy (half the padded flat parameter's fp32 bytes) from a bf16 copy of the shard."""
    world = 4
    p = _predict("dist_fsdp1.py", world, env={"MIXED": "1", "ORIG": "1"}).rank(0).prediction
    shard = fsdp1_shard_bytes(world, align=8)
    assert shard != fsdp1_shard_bytes(world)   # the alignment padding shows
    # rank 0's shard of each unit lies inside its first parameter: AdamW's state is the whole shard
    assert live_at_end(p) == {"parameter": shard, "gradient": shard, "optimizer_state": 2 * shard}
    block = padded_flat_numel(F1_BLOCK, world, align=8)
    sizes = {size for size, _ in _gathered(p)}
    assert block * 2 in sizes and block // world * 2 in sizes and block * 4 not in sizes


def test_fsdp1_size_policy_wraps_each_linear():
    p = _predict("dist_fsdp1.py", 2, env={"WRAP": "size", "ORIG": "1"}).rank(0).prediction
    shard = fsdp1_shard_bytes(2, wrap="size", align=4)
    assert live_at_end(p) == {"parameter": shard, "gradient": shard, "optimizer_state": 2 * shard}


@pytest.mark.parametrize("strategy", ["SHARD_GRAD_OP", "NO_SHARD"])
def test_fsdp1_other_sharding_strategies(strategy):
    """SHARD_GRAD_OP keeps each block gathered from forward to backward (one all-gather a step);
    NO_SHARD keeps whole parameters, gradients and AdamW state on every rank and gathers nothing."""
    world = 2
    p = _predict("dist_fsdp1.py", world, env={"STRATEGY": strategy}).rank(0).prediction
    if strategy == "NO_SHARD":
        whole = sum(sum(unit) for unit in F1_UNITS["transformer"]) * 4
        assert live_at_end(p) == {"parameter": whole, "gradient": whole, "optimizer_state": 2 * whole}
        assert not [size for size, stream in _gathered(p) if stream != 0]
        return
    shard = fsdp1_shard_bytes(world)
    assert live_at_end(p) == {"parameter": shard, "gradient": shard, "optimizer_state": 2 * shard}
    block = padded_flat_numel(F1_BLOCK, world) * 4
    assert len([size for size, stream in _gathered(p) if size == block and stream != 0]) == F1_LAYERS * 3


SHARDED_STATE_DICT = """
import torch, torch.nn as nn, torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType
dist.init_process_group("nccl")
model = FSDP(nn.Linear(64, 64).cuda())
model(torch.randn(2, 64, device="cuda")).sum().backward()
with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
    state = model.state_dict()   # FSDP's post-state-dict hook wraps each shard in a ShardedTensor
print("sharded:", sorted(state), [tuple(v.local_tensor().shape) for v in state.values()])
"""


def test_fsdp1_sharded_state_dict_is_made_of_the_ranks_shards(tmp_path, capfd):
    """HF Trainer's FSDP checkpoints (SHARDED_STATE_DICT): amem's own device check asked a
    ShardedTensor, which has no storage of its own, for one, and the job read "the script failed";
    the state dict is made, each value the rank's shard."""
    script = tmp_path / "sharded.py"
    script.write_text(SHARDED_STATE_DICT)
    _predict_argv([str(script)], 2)
    assert "sharded: ['bias', 'weight'] [(32, 64), (32,)]" in capfd.readouterr().out   # rank 0's rows


MERGED_GATHERS = {
    "fsdp1_optimizer_state": """
import torch, torch.nn as nn, torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
dist.init_process_group("nccl")
model = FSDP(nn.Sequential(nn.Linear(1024, 1024, bias=False), nn.Linear(1024, 8, bias=False), nn.LayerNorm(8)).cuda(),
             use_orig_params=True)   # rank 0's half of the flat parameter holds none of the last two layers
opt = torch.optim.AdamW(model.parameters())
model(torch.randn(4, 1024, device="cuda")).sum().backward()
opt.step()
FSDP.optim_state_dict(model, opt)   # all_gather_object of each rank's optimizer keys, merged
""",
    "distributed_checkpoint": """
import sys, torch, torch.nn as nn, torch.distributed as dist, torch.distributed.checkpoint as dcp
from torch.distributed.fsdp import fully_shard
dist.init_process_group("nccl")
model = fully_shard(nn.Linear(64, 64).cuda())
dcp.save(model.state_dict(), checkpoint_id=sys.argv[1])   # gather_object of each rank's plan, checked whole
"""}


def test_code_merging_what_an_object_gather_answered_fails_as_amems_limit(tmp_path):
    """Each rank's object gathers answer with its own objects; a distributed checkpoint's save
    merges them, checks they cover the whole, and fails: that read as "the script failed" (HF
    Trainer's and litgpt's FSDP checkpoints). It is amem's limit, said."""
    name = "distributed_checkpoint"
    from amem_alloc.predict.notes import NotModelledError

    script = tmp_path / f"{name}.py"
    script.write_text(MERGED_GATHERS[name])
    with pytest.raises(NotModelledError) as err:
        _predict_argv([str(script), str(tmp_path / "checkpoint")], 2)
    assert "gathered from every rank" in str(err.value) and "records each rank apart" in str(err.value)



def test_a_checkpoint_merging_gathered_objects_after_steps_keeps_the_steps_predicted(tmp_path):
    """FSDP1's optimizer state dict merges what each rank's all_gather_object answered and fails
    the same way; made after an optimizer step (a checkpoint saved in training), it ended the
    prediction as not modelled, losing the step: the step made stands, and each rank says where
    and why its script stopped (rank 0, whose optimizer holds none of the keys the merge checks;
    rank 1's merge passes)."""
    script = tmp_path / "osd.py"
    script.write_text(MERGED_GATHERS["fsdp1_optimizer_state"])
    result = _predict_argv([str(script)], 2, ranks=(0, 1))
    assert [r.steps for r in result.ranks] == [1, 1]
    for said in [result.rank(0).prediction.stopped_after]:
        assert said.startswith("the script ran 1 optimizer step, then stopped at osd.py:10 "), said
        assert "records each rank apart" in said and said.endswith("not what it would have done after")


def test_fsdp1_cpu_offload_is_refused_in_one_line_with_exit_4():
    proc = run_command([sys.executable, "-m", "amem_alloc", "predict", "--nproc-per-node", "2", "--", "python",
                        str(MODELS / "dist_fsdp1.py")], env={"OFFLOAD": "1"}, timeout=300)
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert "FSDP1 (FullyShardedDataParallel) with CPUOffload(offload_params=True) is not modelled" in proc.stderr
    assert "dist_fsdp1.py:" in proc.stderr and "Traceback" not in proc.stderr


# ---------------------------------------------------------------------------- tensor parallelism
TP_WIDTH, TP_HIDDEN = 1024, 4096   # tests/predict_models/dist_tp.py


def tp_param_bytes(tp: int, dp: int = 1) -> int:
    """Bytes of one rank's parameters: ColwiseParallel shards Linear(W, H)'s weight and bias on the
    output dim (H/tp rows), RowwiseParallel shards Linear(H, W)'s weight on the input dim (H/tp
    columns) and replicates its bias; fully_shard over dp then shards each local tensor's dim 0."""
    colwise = TP_HIDDEN // tp * TP_WIDTH + TP_HIDDEN // tp
    rowwise = TP_WIDTH * (TP_HIDDEN // tp) + TP_WIDTH
    return (colwise + rowwise) * 4 // dp


@pytest.mark.parametrize("mesh, world, tp, dp", [("tp", 4, 4, 1), ("2d", 4, 2, 2)])
def test_tensor_parallel_params_and_adam_state_are_the_rank_shards(mesh, world, tp, dp):
    result = _predict("dist_tp.py", world, env={"MESH": mesh})
    state = live_at_end(result.rank(0).prediction)
    assert state.get("parameter") == tp_param_bytes(tp, dp), state
    assert state.get("optimizer_state") == 2 * tp_param_bytes(tp, dp), state
    assert state.get("gradient") == tp_param_bytes(tp, dp), state


@pytest.mark.parametrize("sequence", ["0", "1"])
def test_tensor_parallel_collective_buffers_die_within_their_step(sequence):
    """DTensor's collectives (functional all-reduce, all-gather, reduce-scatter) come back as
    AsyncCollectiveTensors; their first use waits for NCCL, so their inputs and outputs are freed
    within the step that made them (they were held to the end of the run while nothing waited),
    and a forward's live activations are first principles: per rank the input, the colwise
    output's shard (ReLU's saved output; the addmm output dies) and, for the rowwise output, only
    what the step still uses."""
    prediction = _predict("dist_tp.py", 2, env={"SEQUENCE": sequence}).rank(0).prediction
    steps = [i for i, name in prediction.markers if name == "step"]
    born = {}
    for i, (kind, key, _, _) in enumerate(prediction.ops):
        op = prediction.infos[key].op
        if not op.startswith(("all_reduce", "all_gather", "reduce_scatter", "wait_tensor")):
            continue
        if kind == ALLOC:
            born[key] = i
        else:
            start = born.pop(key)
            assert not any(start < s < i for s in steps), (op, start, i)   # freed in its own step
    assert not born, born   # every collective buffer freed before the run ends
    assert any(prediction.infos[k].op.startswith(("all_reduce", "all_gather", "reduce_scatter"))
               for _, k, _, _ in prediction.ops)


def test_sequence_parallel_runs_and_shards_like_tensor_parallel():
    result = _predict("dist_tp.py", 2, env={"SEQUENCE": "1"})
    state = live_at_end(result.rank(0).prediction)
    assert state.get("parameter") == tp_param_bytes(2) and state.get("optimizer_state") == 2 * tp_param_bytes(2)


def test_tensor_parallel_attention_on_dtensors_runs_the_kernel_the_rank_shard_takes():
    """pytorch/examples' fsdp_tp_example pattern (tests/predict_models/dist_tp_attention.py, 2 ranks):
    the mesh from init_device_mesh alone reaches the fake process group (DeviceMesh calls
    init_process_group by its own name), and scaled_dot_product_attention on DTensors (heads
    sharded) takes a fused kernel the card picks for this rank's shard (bf16 causal on an H100:
    cuDNN's with torch 2.14, flash's with older releases), whose output is the shard's [B, H/2, T, D]
    bf16 and its log-sum-exp [B, H/2, T] fp32 (it stopped with "mixed torch.Tensor and DTensor" on
    the math path a meta tensor takes)."""
    prediction = _predict("dist_tp_attention.py", 2).rank(0).prediction
    fused = ("_scaled_dot_product_flash_attention.", "_scaled_dot_product_cudnn_attention.")
    forward = sorted(size for kind, key, size, _ in prediction.ops
                     if kind == ALLOC and prediction.infos[key].op.startswith(fused) and size > 8)
    batch, tokens, heads, head_dim = 2, 256, 8 // 2, 64
    assert forward == [batch * heads * tokens * 4, batch * heads * tokens * head_dim * 2], forward


def test_a_rank_failing_while_a_worker_records_another_ends_with_its_error_not_a_hang():
    """With no ranks named, rank 0 is recorded here while a forked worker records the last
    (symmetry.py). Rank 0's failure used to leave the worker waiting at its exit for its answer to
    be read, and this process waiting for the worker: `amem predict` never returned."""
    proc = run_command([sys.executable, "-m", "amem_alloc", "predict", "--gpu", "H100", "--", "torchrun",
                        "--nproc_per_node=4", str(MODELS / "dist_rank0_fails.py")], timeout=240)
    assert proc.returncode != 0
    assert "rank 0 stops here" in proc.stderr


def test_object_collectives_answer_from_the_ranks_own_objects():
    """broadcast_object_list, all_gather_object and gather_object (tests/predict_models/dist_objects.py,
    2 ranks): the fake group carries no values, so each rank answers from its own objects (a
    receiving rank keeps the list it passed; gathers repeat this rank's object) and says so, where
    torch's own code on the fake group read uninitialised sizes. The rank receiving the broadcast
    records the same program as the source yet keeps its own notes."""
    result = _predict("dist_objects.py", 2, ranks=(0, 1))
    prediction = result.rank(0).prediction
    assert [s // 1024 for kind, key, s, _ in prediction.ops if kind == ALLOC] == [17, 2 * 19]
    assert result.rank(1).same_as == 0
    stand_ins = {rank: sorted(n["what"].split(":")[0] for n in result.rank(rank).prediction.notes
                              if n["kind"] == "stand-in") for rank in (0, 1)}
    assert stand_ins == {0: ["torch.distributed.all_gather_object", "torch.distributed.gather_object"],
                         1: ["torch.distributed.all_gather_object", "torch.distributed.broadcast_object_list"]}


def test_zero_consolidation_gives_other_ranks_shards_without_state(capfd):
    """ZeroRedundancyOptimizer.consolidate_state_dict (tests/predict_models/dist_zero.py, 2 ranks):
    its own object broadcast unpickled zero bytes on rank 0 ("EOFError: Ran out of input"), the
    script's failure to read; rank 0 now holds its own shard's states and the other's parameter
    groups, and says so; rank 1 sends its shard by torch's own code."""
    result = _predict("dist_zero.py", 2, ranks=(0, 1))
    assert "consolidated: 2 states, 4 parameters" in capfd.readouterr().out
    said = [n["what"] for n in result.rank(0).prediction.notes if n["kind"] == "stand-in"]
    assert any(what.startswith("ZeroRedundancyOptimizer.consolidate_state_dict") for what in said), said
    assert not any("ZeroRedundancyOptimizer" in n["what"] for n in result.rank(1).prediction.notes)


def test_accelerate_loop_under_torchrun_runs_every_rank_with_its_ddp_model_state(monkeypatch):
    """A plain accelerate loop (tests/programs/accelerate_loop.py: bf16, accelerator.accumulate)
    under torchrun with 2 processes: accelerate keeps its distributed state in process-wide
    singletons, which rank 0 left set for rank 1 (DDP then found no process group); each rank
    holds the parameters, .grad plus DDP's buckets and AdamW's state, to the byte."""
    pytest.importorskip("accelerate")
    monkeypatch.chdir(Path(__file__).parent / "programs")
    result = _predict_argv(["accelerate_loop.py"], 2, ranks=(0, 1))
    params = 4 * (4 * (1024 * 1024 + 1024) + 10 * 1024 + 10)
    for rank in (0, 1):
        state = live_at_end(result.rank(rank).prediction)
        assert (state.get("parameter"), state.get("gradient"), state.get("optimizer_state")) == (
            params, 2 * params, 2 * params), (rank, state)


# ---------------------------------------------------------------------------- meta-device initialisation
def test_a_model_built_on_meta_holds_only_its_shards_after_to_empty():
    """torchtitan's path: built on meta (nothing allocated, tensors say meta), fully_shard'ed,
    to_empty(device="cuda") allocates each rank's shards, init fills them. Per rank exactly the
    shard of the parameters (and their gradients and AdamW state) — no full-size copy of any
    parameter is ever made outside FSDP's all-gathers."""
    world, buffer = 2, 64 // 2 * 4   # the freqs buffer, recomputed on the GPU by init_weights (not sharded)
    p = _predict("dist_meta_init.py", world).rank(0).prediction
    state = live_at_end(p)
    assert state.get("parameter") == PARAM_BYTES // world + buffer
    assert state.get("gradient") == PARAM_BYTES // world
    assert state.get("optimizer_state") == 2 * PARAM_BYTES // world
    full = WIDTH * WIDTH * 4
    made_whole = [p.infos[key] for kind, key, size, _ in p.ops if kind == ALLOC and size == full]
    # whole: only the all-gathered parameters, and backward's full gradients before their reduce-scatter
    assert made_whole and all(i.category == "parameter (gathered)" or i.phase == "backward" for i in made_whole), \
        {(i.op, i.category, i.phase) for i in made_whole}
    shards = [size for kind, key, size, _ in p.ops if kind == ALLOC and p.infos[key].op == "empty_like.default"]
    assert sorted(shards) == sorted([WIDTH * WIDTH * 4 // world, WIDTH * 4 // world] * LAYERS + [buffer])   # to_empty


# ---------------------------------------------------------------------------- what torch's C++ allocates
def test_a_barrier_with_device_ids_records_the_byte_c10d_makes_without_the_driver(capfd):
    """c10d's C++ barrier makes `at::empty({1}, device)` and keeps it in a static, replaced at each
    barrier (ProcessGroup.hpp); made for real it asked the CUDA driver ("Found no NVIDIA driver").
    Predicted: one 1-byte storage per barrier, the previous one freed after the next is made. A
    gloo group's monitored barriers (Lightning's) pass and make none: the fake process group
    refused them ("only GLOO supports monitored barrier"), failing litgpt's 2-device finetune."""
    p = _predict("dist_barrier.py", 2).rank(0).prediction
    assert "monitored barriers passed" in capfd.readouterr().out
    made = [(kind, key) for kind, key, size, _ in p.ops if kind == ALLOC and p.infos[key].op == "c10d barrier"]
    assert [p.infos[key].requested for _, key in made] == [1, 1]
    first, second = made[0][1], made[1][1]
    order = [(kind, key) for kind, key, _, _ in p.ops if key in (first, second)]
    assert order == [(ALLOC, first), (ALLOC, second), (FREE, first)]


# ---------------------------------------------------------------------------- values a broadcast delivers
def test_a_broadcast_delivers_the_values_an_earlier_root_sent(capfd):
    """tests/predict_models/dist_broadcast_values.py on 3 ranks, in turn: rank 0 sends [7, 8, 9]
    (the others put -1) and every rank reads it, as a GPU run's would; on a group of ranks 0 and 1,
    rank 1 sends 11, and rank 0, recorded before it, cannot know that: its read is a stand-in (0)
    with a note, where it had kept its own 10 and taken it for rank 1's."""
    result = predict_ranks(launch_mod.Launch(3, 1, (0, 1, 2)), [str(MODELS / "dist_broadcast_values.py")], "H100",
                           "torch", steps=0, timeout=300, workers=1)
    out = capfd.readouterr().out
    assert "rank 0 received [7, 8, 9] and [11]" in out   # recorded again after rank 1 (below)
    assert "rank 1 received [7, 8, 9] and [11]" in out
    assert "rank 2 received [7, 8, 9] and [12]" in out   # not in the group: its own tensor, untouched
    stand_ins = {r: [n["what"] for n in result.rank(r).prediction.notes if n["kind"] == "stand-in"] for r in (0, 1, 2)}
    assert stand_ins[0] == stand_ins[1] == stand_ins[2] == [], stand_ins


ROOT_DECIDES = """
import torch, torch.distributed as dist
dist.init_process_group("nccl")
rank = dist.get_rank()
groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]   # each pair's first rank decides, as Megatron's
flag = torch.tensor([1 if rank % 2 == 0 else 0], device="cuda")   # tensor-parallel group's first rank
dist.broadcast(flag, src=rank - rank % 2, group=groups[rank // 2])   # says whether to train at all
if flag.item():
    held = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
"""


@pytest.mark.parametrize("ranks, workers", [((3,), 1), ((0, 1, 2, 3), 2)])
def test_a_rank_that_reads_what_its_root_sent_is_recorded_after_that_root(tmp_path, ranks, workers):
    """Rank 3 reads what rank 2 broadcast: recorded alone (`--rank 3`), or in a worker other than
    rank 2's, it had an unknown value there (a stand-in 0: it would not train, 0 bytes where the
    GPU run holds 64 MiB). The roots whose unknown values a rank read are recorded first in the
    same process, and the rank again: each rank holds the 64 MiB its root's flag asks for."""
    script = tmp_path / "root_decides.py"
    script.write_text(ROOT_DECIDES)
    result = predict_ranks(launch_mod.Launch(4, 1, ranks), [str(script)], "H100", "torch", steps=0, timeout=300,
                           workers=workers)
    for r in ranks:
        prediction = result.rank(r).prediction
        assert prediction.row("torch").peak_allocated >= 64 << 20, (r, prediction.row("torch").peak_allocated)
        assert not [n for n in prediction.notes if n["kind"] == "stand-in"], prediction.notes


ROOT_CHECKED = """
import torch, torch.distributed as dist
dist.init_process_group("nccl")
rank = dist.get_rank()
count = torch.tensor(115 if rank == 0 else -1, device="cuda")   # DeepSpeed ZeRO-3's check that the
dist.broadcast(count, src=0)                                     # ranks agree with rank 0's list length
assert count.cpu().item() == 115, f"rank {rank} disagrees with rank 0"
held = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
"""


@pytest.mark.parametrize("world, ranks, workers", [(4, None, None), (2, (1,), 1)])
def test_a_rank_that_failed_on_what_its_root_sent_is_recorded_again_after_it(tmp_path, capfd, world, ranks, workers):
    """Rank 3, recorded in a worker beside rank 0's (a 4-rank DeepSpeed ZeRO-3 job by default), or
    rank 1 alone, read rank 0's broadcast through a copy as the stand-in 0, failed the script's
    check, and the job read "the script failed". It is recorded again after rank 0 and passes;
    the line above says why its first failure is shown."""
    script = tmp_path / "root_checked.py"
    script.write_text(ROOT_CHECKED)
    result = predict_ranks(launch_mod.Launch(world, 1, ranks), [str(script)], "H100", "torch", steps=0, timeout=300,
                           workers=workers)
    for r in ranks or (0, 3):   # None: the ends recorded together, the rest taken as rank 0
        assert result.rank(r).prediction.row("torch").peak_allocated >= 32 << 20
    if workers == 1:   # (a worker's output is its own)
        assert f"amem predict: rank {ranks[-1]} failed (above) after reading what rank 0 broadcast" in capfd.readouterr().err


PAD_ACROSS = """
import torch, torch.distributed as dist
import torch.distributed._functional_collectives as fc
dist.init_process_group("nccl")
logits = torch.randn(4, 128, device="cuda")
size = torch.tensor(logits.shape, device="cuda")[None]            # accelerate's pad_across_processes
sizes = torch.empty(dist.get_world_size() * size.numel(), dtype=size.dtype, device="cuda")
dist.all_gather_into_tensor(sizes, size)
functional = fc.all_gather_tensor(size, 0, dist.group.WORLD)
print("rank", dist.get_rank(), "sizes", sizes.view(-1, 2).cpu().tolist(), functional.cpu().tolist())
padded = logits.new_zeros(4, max(int(s[1]) for s in sizes.view(-1, 2)))
padded[:, :128] = logits
"""


def test_an_all_gather_of_known_values_gives_every_rank_this_ranks_value(tmp_path, capfd):
    """accelerate pads each rank's tensors to the largest of the ranks' sizes, gathered with
    all_gather_into_tensor: the gathered sizes were unknown (torch's fake group copies nothing
    from a 2-d input into a flat output), read as zeros, and the padding failed ("The expanded size
    of the tensor (0) must match ... 128"), so every multi-GPU Trainer evaluation stopped as the
    script's failure. The ranks run one program: each rank's slot holds this rank's value."""
    script = tmp_path / "pad.py"
    script.write_text(PAD_ACROSS)
    result = predict_ranks(launch_mod.Launch(2, 1, (0, 1)), [str(script)], "H100", "torch", steps=0, timeout=300,
                           workers=1)
    out = capfd.readouterr().out
    for r in (0, 1):
        assert f"rank {r} sizes [[4, 128], [4, 128]] [[4, 128], [4, 128]]" in out, out
        assert not [n for n in result.rank(r).prediction.notes if n["kind"] == "stand-in"]


COALESCED = """
import torch, torch.distributed as dist
dist.init_process_group("nccl")
world = dist.get_world_size()
grads = [torch.empty(4 << 20, dtype=torch.uint8, device="cuda") for _ in range(2)]          # 8 MiB
shards = [torch.empty(2 << 20, dtype=torch.uint8, device="cuda") for _ in range(2)]         # 4 MiB
gathered = [torch.empty(world * (2 << 20), dtype=torch.uint8, device="cuda") for _ in range(2)]  # 8 MiB
with dist._coalescing_manager(async_ops=True) as cm:   # Megatron's gradient buckets: one coalesced call
    for g in grads:
        dist.all_reduce(g, async_op=True)
cm.wait()
with dist._coalescing_manager():
    for out, g in zip(shards, grads):
        dist.reduce_scatter_tensor(out, g)
with dist._coalescing_manager():
    for out, s in zip(gathered, shards):
        dist.all_gather_into_tensor(out, s)
print("coalesced done")
"""


def test_coalesced_collectives_write_into_their_tensors_and_allocate_nothing(tmp_path, capfd):
    """dist._coalescing_manager's fast path calls c10d's coalesced ops, for which torch registers no
    meta kernel (Megatron's DDP: "allreduce_coalesced_ ... no fake impl", reported as amem's): they
    write into the tensors given, as ProcessGroupNCCL's do, and allocate nothing."""
    assert _rank0_peak(tmp_path, COALESCED, capfd, "coalesced done") == 20 << 20


GLOO_GROUP = """
import torch, torch.distributed as dist
dist.init_process_group("nccl")
cpu_group = dist.new_group(backend="gloo")   # Megatron's gloo groups (distributed optimizer's checkpoints)
pair = dist.new_group([0, 1], None, "gloo")
flags = torch.zeros(3)
dist.all_reduce(flags, group=cpu_group)
x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
print("gloo groups made")
"""


def test_a_group_on_another_backend_is_the_fake_one_too(tmp_path, capfd):
    """dist.new_group(backend="gloo") built gloo on the fake store, which crashed the process
    (a segmentation fault, Megatron with --use-distributed-optimizer)."""
    assert _rank0_peak(tmp_path, GLOO_GROUP, capfd, "gloo groups made") == 1 << 20


def _rank0_peak(tmp_path, text: str, capfd, printed: str) -> int:
    """Rank 0 of 2 of the script `text`: its peak allocated under torch's policy, once the script
    printed `printed` (it ran to its end)."""
    script = tmp_path / "script.py"
    script.write_text(text)
    result = predict_ranks(launch_mod.Launch(2, 1, (0,)), [str(script)], "H100", "torch", steps=0, timeout=300)
    assert printed in capfd.readouterr().out
    return result.rank(0).prediction.row("torch").peak_allocated


COMPILED_DDP = """
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("nccl")
torch.cuda.set_device(dist.get_rank())
model = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(512, 512), torch.nn.GELU())]).cuda()
model = DDP(torch.compile(model), bucket_cap_mb=1)   # as nanoGPT: compiled, then wrapped
for _ in range(2):
    model(torch.randn(64, 512, device="cuda")).sum().backward()
"""


def test_a_compiled_model_under_ddp_is_predicted_graph_by_graph_as_dynamos_ddp_optimizer_splits_it(tmp_path, capfd):
    """dynamo's DDP optimizer splits a compiled module run inside DDP's forward into one graph per
    gradient bucket (torch/_dynamo/backends/distributed.py); its first call of each split graph
    returns only the outputs' fakes (AOTAutograd's FakifiedOutWrapper), which the replay once
    took for the graph's run and every graph ran as eager. Each rank's region says how dynamo
    split it (not graph breaks), every graph is predicted as compiled, and each saves what
    torch's own partition of that split graph saves (tests/compiled_reference.py runs dynamo's
    DDP optimizer on the CPU under torch's fake process group). DDP's logger times no iteration
    on the fake device (its C++ warning is not printed). What holds memory is named by the
    program's modules, not by the modules dynamo wraps each split graph in."""
    script = tmp_path / "compiled_ddp.py"
    script.write_text(COMPILED_DDP)
    result = predict_ranks(launch_mod.Launch(2, 1, None), [str(script)], "H100", "torch", steps=2, timeout=300,
                           workers=1)
    expected = [sum(g) for g in compiled_reference.ddp_compiled_saved(512, 4, 64, 1)]
    assert len(expected) == 4 and all(expected), expected   # one graph per 1 MiB bucket, each saving its GELU's input
    for r in result.ranks:
        region, = r.prediction.run.compiled_regions
        split = re.match(r"predicted as compiled \(inductor\) in (\d+) graphs; dynamo's DDP optimizer splits it at "
                         r"DDP's gradient buckets", region["status"])
        assert split and int(split.group(1)) == len(expected), region
        assert [g["status"] for g in region["graphs"]] == ["predicted as compiled (inductor)"] * len(expected), region
        assert [g["saved_bytes"] for g in region["graphs"]] == expected, region
        assert not [n for n in r.prediction.notes if n["kind"] == "not-modelled" and "Sequential" in n["what"]]
        modules = r.prediction.to_dict()["at_peak_modules"]   # dynamo's wrappers of the split graphs take no place
        assert modules and not [m for m in modules if "compiled_submod" in json.dumps(m)], modules
    assert "Time stats are currently only collected" not in capfd.readouterr().err


COMPILED_FSDP = """
import sys, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
{block}
dist.init_process_group("nccl")
torch.cuda.set_device(dist.get_rank())
if sys.argv[1] == "block":
    model = Block(512).cuda()
else:
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512)).cuda()
if sys.argv[1] == "sequential-compiled-first":   # torchtitan's order: module.compile(), then fully_shard
    model.compile()
    fully_shard(model)
else:
    fully_shard(model)
    model = torch.compile(model)
opt = torch.optim.AdamW(model.parameters())
for _ in range(2):
    model(torch.randn(64, 512, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.parametrize("kind", ["block", "sequential", "sequential-compiled-first"])
def test_a_model_compiled_after_fully_shard_compiles_what_torch_compiles(kind, tmp_path, capfd):
    """`fully_shard(model)` then `torch.compile(model)` (or `model.compile()` then `fully_shard`,
    the same call compiled): FSDP2's hooks are dynamo-disabled, so torch
    runs them eager and compiles the forward of a module class of the program's as one graph, and
    nothing of torch's own Sequential (dynamo skips its forward as a frame). The prediction does
    the same: the block's graph saves what torch's partition of it saves (compiled_reference.py,
    on the CPU under torch's fake process group), the Sequential runs eager and says why. The
    region never runs on torch's fakes first: FSDP2's hooks there would gather into its own state
    with fake tensors (the script failed in FSDP's all-gather: "'FSDPParam' object has no
    attribute 'param_dtype'"). Each rank holds its half of the parameters and twice that of AdamW."""
    script = tmp_path / "compiled_fsdp.py"
    script.write_text(COMPILED_FSDP.format(block=compiled_reference.FSDP_BLOCK))
    result = predict_ranks(launch_mod.Launch(2, 1, None), [str(script), kind], "H100", "torch", steps=2,
                           timeout=300, workers=1)
    expected = [sum(g) for g in compiled_reference.fsdp_compiled_saved(kind.split("-")[0], 512, 64)]
    assert (len(expected), kind.split("-")[0]) in ((1, "block"), (0, "sequential")) and all(expected), expected
    params = (512 * 1024 + 1024 + 1024 * 512 + 512) * 4 // 2   # fp32, halved by the shard
    for r in result.ranks:
        region, = r.prediction.run.compiled_regions
        assert [g["saved_bytes"] for g in region["graphs"]] == expected, region
        if kind == "block":
            assert region["status"].startswith("predicted as compiled (inductor)"), region
        else:
            assert "runs as eager, as torch runs it" in region["status"] and "Sequential.forward" in region["status"]
        held = r.prediction.to_dict()["at_peak"]
        assert abs(held["parameter"] - params) < 4096 and abs(held["optimizer_state"] - 2 * params) < 8192, held
    assert "the script failed" not in capfd.readouterr().out


COMPILED_FSDP1 = """
import sys, torch, torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
dist.init_process_group("nccl")
model = FSDP(torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)]).cuda(), use_orig_params=True,
             device_id=torch.cuda.current_device())
if sys.argv[1] == "compiled":
    model = torch.compile(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    model(torch.randn(2048, 1024, device="cuda")).float().pow(2).mean().backward()
    opt.step(); opt.zero_grad(set_to_none=True)
    print("between steps", torch.cuda.memory_allocated(), flush=True)
"""


def test_a_compiled_fsdp1_model_runs_as_eager_and_holds_what_eager_holds(tmp_path, capfd):
    """litgpt's `--devices 2` compiles its FSDP1 model: the region was first tried on torch's fakes,
    where FSDP1's lazy initialisation and hooks ran part-way on them before failing ("FSDP does not
    support CPU only execution"), and each later step held one more 8 MiB activation (123 MiB too
    high for litgpt). The region runs as eager, said, with eager's figures to the byte."""
    script = tmp_path / "fsdp1.py"
    script.write_text(COMPILED_FSDP1)
    held = {}
    for kind in ("compiled", "eager"):
        result = predict_ranks(launch_mod.Launch(1, 1, None), [str(script), kind], "H100", "torch", steps=3,
                               timeout=300, workers=1)
        prediction = result.ranks[0].prediction
        held[kind] = (prediction.rows[0].peak_allocated, capfd.readouterr().out.count("between steps"))
        regions = prediction.run.compiled_regions
        assert [r["status"].startswith("runs as eager: a FullyShardedDataParallel (FSDP1)") for r in regions] == \
            ([True] if kind == "compiled" else []), regions
    assert held["compiled"] == held["eager"], held


UNKNOWN_ROOT = """
import os, sys, torch, torch.distributed as dist
dist.init_process_group("nccl")
with open(sys.argv[1], "a") as f:
    f.write(f"{dist.get_rank()}\\n")
decision = torch.randn(1, device="cuda")   # unknown on the root too (Lightning's reduced decisions)
dist.broadcast(decision, src=0)
if decision.item() > 0:
    held = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
"""


def test_a_root_recorded_in_this_process_is_not_recorded_again_for_what_it_could_not_know(tmp_path):
    """Rank 1 reads a value rank 0 broadcast that rank 0 itself did not know: recording rank 0
    again, and rank 1 after it, gave nothing and doubled every Lightning DDP prediction."""
    script, runs = tmp_path / "unknown_root.py", tmp_path / "runs.txt"
    script.write_text(UNKNOWN_ROOT)
    runs.write_text("")   # there before: each run appends to it (a new file would be each rank's own)
    predict_ranks(launch_mod.Launch(2, 1, None), [str(script), str(runs)], "H100", "torch", steps=0, timeout=300,
                  workers=1)
    assert runs.read_text().split() == ["0", "1"]
