"""Scripts that start their own ranks (torch.multiprocessing.spawn) or join a process group in a
one-process prediction (amem_alloc/predict/distributed/spawn.py): predicted as the ranks they
are, each the program torchrun's rank of the same job makes; what cannot be taken is one line."""
import json
import sys
from pathlib import Path

import pytest

from helpers import run_command

pytest.importorskip("torch")

MODELS = Path(__file__).parent / "predict_models"
SPAWN = str(MODELS / "dist_spawn.py")


def _line_of(text: str) -> int:
    """The line of dist_spawn.py that holds `text`, as a call site names it."""
    return next(i for i, line in enumerate(Path(SPAWN).read_text().splitlines(), 1) if text in line)


def _predict(tmp_path, *argv, env=None, options=()):
    out = tmp_path / "prediction.json"
    proc = run_command([sys.executable, "-m", "amem_alloc", "predict", "--policy", "torch", "--json", str(out),
                        *options, "--", *argv], env=env, timeout=400)
    data = json.loads(out.read_text()) if out.exists() else None
    return proc, data


def _peaks(data) -> dict[int, int]:
    return {r["rank"]: r["policies"][0]["peak_allocated"] for r in data["ranks"]}


def test_spawned_processes_are_the_ranks_torchrun_would_start(tmp_path):
    """--nproc-per-node 2: device_count is 2, so the script spawns 2 processes; each rank runs the
    spawned function as its own process would (its rank, world and GPU) and ends with it, and
    allocates what the same body run by torchrun's rank allocates."""
    proc, data = _predict(tmp_path, "python", SPAWN, options=("--nproc-per-node", "2", "--rank", "all"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "process 0: rank 0 of 2 on cuda:0" in proc.stdout and "process 1: rank 1 of 2 on cuda:1" in proc.stdout
    assert "all processes ended" not in proc.stdout   # the parent's own code after the spawn is no rank's
    (tmp_path / "direct").mkdir()
    direct, reference = _predict(tmp_path / "direct", "torchrun", "--nproc-per-node", "2", SPAWN, "direct",
                                 options=("--rank", "all"))
    assert direct.returncode == 0, direct.stderr[-2000:]
    assert _peaks(data) == _peaks(reference) and min(_peaks(data).values()) > 5 * 4 * (1024 * 1024 + 1024) * 4 - 1


def test_a_one_process_prediction_of_a_spawning_script_predicts_its_ranks(tmp_path):
    """Without --nproc-per-node the script sees one GPU and spawns one process (a world of 1); a
    script that spawns a fixed 2 is predicted as 2 ranks; either way it says so in one line."""
    proc, data = _predict(tmp_path, "python", SPAWN)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "the script starts 1 process (torch.multiprocessing.spawn at " in proc.stderr
    assert f"dist_spawn.py:{_line_of('mp.spawn(train, args=(world,), nprocs=world)')})" in proc.stderr
    assert data["world_size"] == 1 and "process 0: rank 0 of 1 on cuda:0" in proc.stdout
    proc, data = _predict(tmp_path, "python", SPAWN, env={"NPROCS": "2", "JOIN": "0"})
    assert proc.returncode == 0, proc.stderr[-2000:]   # rank 1's run no longer waits for rank 0's results
    assert "the script starts 2 processes" in proc.stderr and "--nproc-per-node 2" in proc.stderr
    assert data["world_size"] == 2 and "process 1: rank 1 of 2 on cuda:1" in proc.stdout


def test_a_one_process_prediction_of_a_script_joining_a_group_predicts_its_ranks(tmp_path):
    """init_process_group("nccl", rank=0, world_size=1) in a plain prediction: no NCCL without a
    GPU (torch: "ProcessGroupNCCL is only supported with GPUs"), so the script is predicted as the
    one rank of its world, on the fake process group, and allocates what torchrun's rank does."""
    proc, data = _predict(tmp_path, "python", SPAWN, "direct", env={"LOCAL_RANK": "0", "WORLD_SIZE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "the script joins a process group of 1 process (init_process_group at " in proc.stderr
    assert f"dist_spawn.py:{_line_of('dist.init_process_group(')})" in proc.stderr
    (tmp_path / "t").mkdir()
    reference = _predict(tmp_path / "t", "torchrun", "--nproc-per-node", "1", SPAWN, "direct")[1]
    assert _peaks(data) == _peaks(reference)


def test_a_fixed_count_other_than_the_jobs_is_one_line(tmp_path):
    proc, _ = _predict(tmp_path, "python", SPAWN, env={"NPROCS": "3"}, options=("--nproc-per-node", "2"))
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert "the script spawns 3 processes (torch.multiprocessing.spawn) where the job has 2 per node: predict it " \
           "with --nproc-per-node 3" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_spawned_functions_own_error_is_the_scripts(tmp_path):
    proc, _ = _predict(tmp_path, "python", SPAWN, env={"FAIL": "1"})
    assert proc.returncode == 1
    assert "ValueError: the script's own error in the spawned function" in proc.stderr
    assert "amem predict: the script failed (exit status 1)" in proc.stderr


CHILD = """
import torch, torch.multiprocessing as mp

def child():
    try:
        torch.zeros(4, device="cuda")
    except Exception as e:   # the child's code catches it and exits non-zero, as torch's spawn wrapper does
        raise SystemExit(1)

if __name__ == "__main__":
    p = mp.get_context("spawn").Process(target=child)
    p.start(); p.join()
    raise SystemExit(p.exitcode)
"""


def test_cuda_in_a_child_that_catches_the_error_is_still_amems_limit(tmp_path):
    """A spawned child's first CUDA call stops it; where the child's own code catches that and
    exits (torch.multiprocessing's `_wrap` does), the parent still names amem's limit, exit 4."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc, _ = _predict(tmp_path, "python", str(script))
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert "used CUDA at" in proc.stderr and "prediction models one process" in proc.stderr


def test_torchruns_agent_started_in_the_program_is_predicted_as_its_ranks(tmp_path):
    """`torch.distributed.run.run(args)` inside the program (tune run --nproc_per_node N) would start
    the ranks as processes outside the prediction: the agent's launch stops the one-process run, and
    the job is predicted as its ranks running its script, each allocating what torchrun's rank of
    that script does. The launcher imported an operator library the script imports again in each
    rank (torchao under tune): its operators are undefined between runs, as in a new process."""
    proc, data = _predict(tmp_path, "python", str(MODELS / "agent_launcher.py"), "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the program starts torchrun's agent for 2 processes per node running " in proc.stderr
    assert "dist_ops.py (at " in proc.stderr and "--nproc-per-node 2 -- python " in proc.stderr
    assert "rank 0: doubled (256, 1024)" in proc.stdout and "rank 1: doubled (256, 1024)" in proc.stdout
    assert data["world_size"] == 2
    (tmp_path / "t").mkdir()
    reference = _predict(tmp_path / "t", "torchrun", "--nproc-per-node", "2", str(MODELS / "dist_ops.py"),
                         options=("--rank", "all"))[1]
    assert _peaks(data) == _peaks(reference) and min(_peaks(data).values()) >= 2 << 20


def test_each_rank_run_in_turn_finds_a_librarys_operators_undefined():
    """Ranks predicted in turn in one process: each imports op_library afresh, whose Library never
    dies by itself (its fake kernel holds it through torch's registry); its operator is undefined
    as the rank's modules are dropped, else rank 1's import met rank 0's definition ("Tried to
    register an operator ... multiple times")."""
    from amem_alloc.predict.distributed.launch import Launch
    from amem_alloc.predict.distributed.ranks import predict_ranks

    result = predict_ranks(Launch(2, 1, (0, 1)), [str(MODELS / "dist_ops.py")], "H100", "torch", steps=0,
                           timeout=300, workers=1)
    assert [r.rank for r in result.ranks] == [0, 1]
    assert "op_library" not in sys.modules


def test_torchruns_agent_given_a_function_runs_it_in_each_rank(tmp_path):
    """elastic_launch(config, train)() (accelerate's notebook_launcher): the agent is never started
    (it would open a store on a real port and wait for workers, 10 minutes until --timeout); each
    rank runs the program again and, at the launch, `train` for that rank, allocating what
    torchrun's rank of the same body does. What the program does after the launch is no rank's."""
    proc, data = _predict(tmp_path, "python", str(MODELS / "agent_function.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the program starts torchrun's agent for 2 processes per node running train (at " in proc.stderr
    assert "rank 0: doubled (256, 1024)" in proc.stdout and "rank 1: doubled (256, 1024)" in proc.stdout
    assert "the agent returned" not in proc.stdout
    (tmp_path / "t").mkdir()
    reference = _predict(tmp_path / "t", "torchrun", "--nproc-per-node", "2", str(MODELS / "dist_ops.py"),
                         options=("--rank", "all"))[1]
    assert _peaks(data) == _peaks(reference)
