"""`accelerate launch` under prediction (amem_alloc/predict/distributed/accelerate_launcher.py): the
job Accelerate's own launcher code decides (one process with its variables, or torchrun's ranks
with them), predicted as it would run."""
import json
import sys

import pytest

from helpers import run_command

pytest.importorskip("torch")
pytest.importorskip("accelerate")

from amem_alloc.predict.distributed.accelerate_launcher import is_accelerate, parse_accelerate  # noqa: E402

SCRIPT = """
import os, torch
from accelerate import Accelerator
acc = Accelerator()
print("accelerator", acc.mixed_precision, acc.num_processes, acc.distributed_type.value)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024))
opt = torch.optim.AdamW(model.parameters())
model, opt = acc.prepare(model, opt)
for _ in range(3):
    acc.backward(model(torch.randn(64, 1024, device=acc.device)).square().mean())
    opt.step()
    opt.zero_grad()
"""


@pytest.fixture
def no_user_config(monkeypatch, tmp_path):
    """Accelerate reads the user's default config file; these tests take none."""
    import accelerate.commands.launch as launch

    monkeypatch.setattr(launch, "default_config_file", str(tmp_path / "none.yaml"))


def test_one_process_is_the_script_with_the_launchers_variables(no_user_config):
    job = parse_accelerate(["accelerate", "launch", "--mixed_precision", "bf16", "train.py", "--lr", "1"])
    assert job.launch is None and job.script == ["train.py", "--lr", "1"]
    assert job.env["ACCELERATE_MIXED_PRECISION"] == "bf16"


def test_several_processes_are_torchruns_ranks_per_node(no_user_config):
    job = parse_accelerate(["/x/accelerate", "launch", "--num_processes", "4", "--num_machines", "2", "--use_fsdp",
                            "-m", "pkg.train"])
    assert (job.launch.nproc_per_node, job.launch.nnodes) == (2, 2) and job.script == ["-m", "pkg.train"]
    assert dict(job.launch.env)["ACCELERATE_USE_FSDP"] == "true"
    assert is_accelerate(["accelerate", "launch", "t.py"]) and not is_accelerate(["accelerate", "config"])


def test_deepspeed_through_accelerate_is_its_ranks_with_its_settings(no_user_config):
    """--use_deepspeed takes the launcher's DeepSpeed branch (its fields from the config file
    named: none here), not its multi-GPU one."""
    job = parse_accelerate(["accelerate", "launch", "--use_deepspeed", "--zero_stage", "2", "--num_processes", "2",
                            "train.py"])
    env = dict(job.launch.env)
    assert (job.launch.nproc_per_node, job.launch.nnodes) == (2, 1)
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true" and env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "2"


@pytest.mark.parametrize("argv, needle", [
    (["accelerate", "launch", "--no_python", "train"], "not predicted"),
    (["accelerate", "launch", "--num_processes", "two", "train.py"], "accelerate launch: "),
])
def test_what_prediction_cannot_take_is_one_line(argv, needle, no_user_config):
    with pytest.raises(ValueError, match=needle):
        parse_accelerate(argv)


def _predict(tmp_path, name, *argv, env=None):
    out = tmp_path / f"{name}.json"
    proc = run_command([sys.executable, "-m", "amem_alloc", "predict", "--policy", "torch", "--json", str(out), "--",
                        *argv], env={"HF_HOME": str(tmp_path / "hf"), **(env or {})}, timeout=400)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc, json.loads(out.read_text())


def test_accelerate_launch_predicts_what_the_launcher_runs(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc, _ = _predict(tmp_path, "one", "accelerate", "launch", "--mixed_precision", "bf16", str(script))
    assert "accelerator bf16 1 NO" in proc.stdout
    proc, ranks = _predict(tmp_path, "two", "accelerate", "launch", "--num_processes", "2", "--mixed_precision", "bf16",
                           str(script))
    assert proc.stdout.count("accelerator bf16 2 MULTI_GPU") == 2
    # the same ranks torchrun starts with the variable the launcher sets
    _, direct = _predict(tmp_path, "torchrun", "torchrun", "--nproc-per-node", "2", str(script),
                         env={"ACCELERATE_MIXED_PRECISION": "bf16"})
    peaks = [[r["policies"][0]["peak_allocated"] for r in d["ranks"]] for d in (ranks, direct)]
    assert peaks[0] == peaks[1] and len(peaks[0]) == 2


SHUFFLED = """
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset
acc = Accelerator()
model = torch.nn.Linear(64, 64)
opt = torch.optim.AdamW(model.parameters())
loader = DataLoader(TensorDataset(torch.randn(256, 64)), batch_size=8, shuffle=True)
model, opt, loader = acc.prepare(model, opt, loader)
for (x,) in loader:
    acc.backward(model(x).square().mean())
    opt.step()
    opt.zero_grad()
print("epoch done on", acc.process_index)
"""


def test_a_shuffled_loader_on_two_processes_syncs_its_generator(tmp_path):
    """accelerate prepares a shuffled DataLoader by broadcasting its sampler's generator state from
    process 0 and setting it (synchronize_rng_states: to the device, broadcast, back to the host):
    the state came back a fake host tensor and torch.Generator.set_state refused it ("RNG state
    must be a torch.ByteTensor"), so every multi-process accelerate program with a shuffled
    loader failed as the script's error. A known value brought to the host is the real tensor."""
    script = tmp_path / "shuffled.py"
    script.write_text(SHUFFLED)
    proc, ranks = _predict(tmp_path, "shuffled", "accelerate", "launch", "--num_processes", "2", str(script))
    assert len(ranks["ranks"]) == 2
