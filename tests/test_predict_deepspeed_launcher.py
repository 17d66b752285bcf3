"""DeepSpeed's launcher command line under prediction (amem_alloc/predict/distributed/
deepspeed_launcher.py): `amem predict -- deepspeed --num_gpus N train.py ARGS` predicts the ranks
the launcher would start, each with the argv (`--local_rank=N`) and environment it would give."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from helpers import run_command

pytest.importorskip("torch")

from amem_alloc.predict.distributed.deepspeed_launcher import is_deepspeed, parse_deepspeed  # noqa: E402
from amem_alloc.predict.distributed.environment import rank_variables  # noqa: E402

MODELS = Path(__file__).parent / "predict_models"


@pytest.mark.parametrize("argv, shape, script", [
    (["deepspeed", "--num_gpus", "4", "train.py", "--lr", "1"], (4, 1), ["train.py", "--lr", "1"]),
    (["deepspeed", "--num_gpus=8", "--num_nodes=2", "train.py"], (8, 2), ["train.py"]),
    (["/usr/bin/deepspeed", "--include", "localhost:0,1,2", "train.py"], (3, 1), ["train.py"]),
    (["deepspeed", "-i", "a:0,1@b:0,1", "--master_port", "29600", "train.py"], (2, 2), ["train.py"]),
    (["deepspeed", "--module", "--num_gpus", "2", "pkg.train", "--x"], (2, 1), ["-m", "pkg.train", "--x"]),
    (["deepspeed", "train.py"], (1, 1), ["train.py"]),
])
def test_the_launchers_shape_and_script(argv, shape, script):
    assert is_deepspeed(argv)
    launch, got = parse_deepspeed(argv)
    assert (launch.nproc_per_node, launch.nnodes) == shape and got == script
    assert launch.launcher == "deepspeed" and launch.local_rank_arg


def test_each_rank_gets_local_rank_first_and_the_launchers_environment():
    launch, script = parse_deepspeed(["deepspeed", "--num_gpus", "2", "--num_nodes", "2", "train.py", "--lr", "1"])
    assert launch.script_for(script, 3) == ["train.py", "--local_rank=1", "--lr", "1"]
    assert launch.script_for(["-m", "pkg", "--x"], 2) == ["-m", "pkg", "--local_rank=0", "--x"]
    env = rank_variables(launch, 3)
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE")} == \
        {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_SIZE": "2", "CROSS_RANK": "1", "CROSS_SIZE": "2"}
    assert "TORCHELASTIC_RUN_ID" not in env   # torchrun's, not DeepSpeed's launcher's
    quiet, script = parse_deepspeed(["deepspeed", "--no_local_rank", "train.py"])
    assert quiet.script_for(script, 0) == ["train.py"]


@pytest.mark.parametrize("argv, needle", [
    (["deepspeed", "--exclude", "localhost:1", "train.py"], "deepspeed --exclude: not predicted"),
    (["deepspeed", "--autotuning", "tune", "train.py"], "deepspeed --autotuning: not predicted"),
    (["deepspeed", "--num_gpus", "2"], "deepspeed: no script given"),
    (["deepspeed", "--num_gpus", "auto", "train.py"], "--num_gpus auto"),
    (["deepspeed", "--include", "localhost", "train.py"], "give each host's GPUs"),
])
def test_what_prediction_cannot_take_is_one_line(argv, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        parse_deepspeed(argv)


ARGV = """
import os, sys
print("argv", sys.argv[1:], "env", os.environ["LOCAL_SIZE"], os.environ["CROSS_SIZE"], os.environ["RANK"])
"""


def test_amem_predict_runs_the_ranks_the_launcher_would_start(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(ARGV)
    proc = run_command([sys.executable, "-m", "amem_alloc", "predict", "--policy", "torch", "--rank", "all", "--",
                        "deepspeed", "--num_gpus", "2", str(script), "--lr", "1"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "argv ['--local_rank=0', '--lr', '1'] env 2 1 0" in proc.stdout
    assert "argv ['--local_rank=1', '--lr', '1'] env 2 1 1" in proc.stdout
    assert "2 ranks (1 node x 2 processes)" in proc.stdout


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed")
def test_a_deepspeed_job_launched_by_deepspeed_is_the_one_torchrun_launches(tmp_path):
    """The same ZeRO-2 script (tests/predict_models/dist_deepspeed.py) under both launchers: the
    same program on each rank."""
    peaks = {}
    for launcher in (["deepspeed", "--num_gpus", "2"], ["torchrun", "--nproc-per-node", "2"]):
        out = tmp_path / f"{launcher[0]}.json"
        proc = run_command([sys.executable, "-m", "amem_alloc", "predict", "--policy", "torch", "--json", str(out), "--",
                            *launcher, str(MODELS / "dist_deepspeed.py")], env={"ZERO": "2"}, timeout=400)
        assert proc.returncode == 0, proc.stderr[-2000:]
        peaks[launcher[0]] = [r["policies"][0]["peak_allocated"] for r in json.loads(out.read_text())["ranks"]]
    assert peaks["deepspeed"] == peaks["torchrun"] and len(peaks["deepspeed"]) == 2
