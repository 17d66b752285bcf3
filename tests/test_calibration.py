"""`amem doctor --calibrate` (amem_alloc/calibration.py): the figures it derives from its stages,
the file it keeps, and its refusals. The stages below are what it measured on an NVIDIA H200
(driver 580.159.04, torch 2.11.0+cu130, 2026-11-27): each a fresh process, NVML's used memory
before CUDA started ('before', which on that driver holds a 618 MiB reserve nvidia-smi does not
show), cudaMemGetInfo's total less free ('used'), torch's reserved memory and NVML's figure for the
process ('process_used', what nvidia-smi lists)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from amem_alloc import calibration

MiB = 1 << 20
H200_STAGES = [
    {"stage": "context", "before": 648347648, "used": 554500096, "reserved": 2097152, "process_used": 545259520},
    {"stage": "context_eager", "before": 648347648, "used": 1322057728, "reserved": 2097152,
     "process_used": 1312817152},
    {"stage": "cublas", "before": 648347648, "used": 774701056, "reserved": 56623104, "process_used": 765460480},
    {"stage": "cudnn", "before": 648347648, "used": 671940608, "reserved": 4194304, "process_used": 662700032},
    {"stage": "training_step", "before": 648347648, "used": 967639040, "reserved": 163577856,
     "process_used": 958398464},
    {"stage": "nccl", "before": 648347648, "used": 850198528, "reserved": 23068672, "process_used": 840957952},
]
for s in H200_STAGES:
    s.update(device="NVIDIA H200", total_memory=143156 * MiB, torch="2.11.0+cu130", cuda="13.0")


def test_the_context_is_what_the_process_holds_beyond_torchs_reserved_memory():
    e = calibration.entry(H200_STAGES)
    # 520 MiB for the process less torch's 2 MiB small segment; not cudaMemGetInfo's used less
    # NVML's 'before' (-92 MiB: the two count from totals 615 MiB apart)
    assert e["context"] == 518 * MiB
    assert e["beyond_context"] == {"context_eager": 732 * MiB, "cublas": 158 * MiB, "cudnn": 110 * MiB,
                                   "training_step": 240 * MiB, "nccl": 262 * MiB}
    assert (e["device"], e["torch"], e["total_memory"]) == ("NVIDIA H200", "2.11.0+cu130", 143156 * MiB)


def test_without_nvmls_process_figure_the_devices_readings_before_and_after_are_used():
    stage = {"stage": "context", "before": 600 * MiB, "after": 1120 * MiB, "reserved": 2 * MiB, "process_used": None}
    assert calibration.outside_allocator(stage) == 518 * MiB
    assert calibration.outside_allocator({"stage": "context", "reserved": 0}) is None


def test_a_gpu_in_use_by_another_process_is_refused():
    moved = [dict(s) for s in H200_STAGES]
    moved[3]["before"] += 300 * MiB
    assert "another process" in calibration._idle_problem(moved)
    assert calibration._idle_problem(H200_STAGES) is None
    assert "NVML" in calibration._idle_problem([{"stage": "context", "before": None}])


def test_entries_are_kept_per_card_driver_and_torch(tmp_path):
    path = tmp_path / "calibration.json"
    e = calibration.entry(H200_STAGES)
    calibration._save(e, path)
    calibration._save({**e, "context": 1}, path)                         # the same stack again: replaced
    calibration._save({**e, "torch": "2.14.1", "date": "2099-01-01"}, path)  # another torch: kept beside it
    assert len(calibration.load(path)) == 2
    assert calibration.for_device("NVIDIA H200", path)["torch"] == "2.14.1"   # the latest
    assert calibration.for_device("NVIDIA A100-SXM4-80GB", path) is None
    path.write_text("{not json")
    assert calibration.load(path) == []


def test_calibration_path_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("AMEM_CALIBRATION", str(tmp_path / "c.json"))
    assert calibration.calibration_path() == tmp_path / "c.json"
    monkeypatch.delenv("AMEM_CALIBRATION")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert calibration.calibration_path() == tmp_path / "amem_alloc" / "calibration.json"


def test_describe_names_every_part():
    text = calibration.describe(calibration.entry(H200_STAGES))
    assert "CUDA context (lazy loading)   518 MiB" in text and "NCCL, one rank" in text and "262 MiB" in text


def test_without_a_gpu_calibrate_is_one_line_and_status_1(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU machine: calibration runs for real there")
    proc = subprocess.run([sys.executable, "-m", "amem_alloc", "doctor", "--calibrate", "--calibration-file",
                           str(tmp_path / "c.json")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("amem doctor --calibrate: no CUDA device")
    assert not (tmp_path / "c.json").exists()
    json.dumps(calibration.load(tmp_path / "c.json"))


def test_an_inference_loop_is_a_stage_of_its_own_and_named():
    assert calibration.STAGES.index("inference_step") > calibration.STAGES.index("training_step")
    stages = H200_STAGES + [dict(H200_STAGES[2], stage="inference_step", process_used=545259520 + 188 * MiB)]
    e = calibration.entry(stages)
    # NVML 520 + 188 MiB for the process, less torch's 54 MiB reserved, less the 518 MiB context
    assert e["beyond_context"]["inference_step"] == (520 + 188 - 54 - 518) * MiB
    assert "an inference loop's kernels" in calibration.describe(e)
