"""Compiled programs predicted for an H200 against real H200 runs of the same programs
(benchmarks/gpu_runs/h200-2026-11-27/predict_vs_real.json: torch 2.11, CUDA 13, torch's allocator at
default settings; issue 33's targets: peak allocated within 2%, reserved within 3%).

The real runs were made before compiled code was predicted as compiled: they are the outside check
of torch's partition and inductor's buffer plan replayed here (torch 2.14 on this machine)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torch._inductor.compile_fx")

import program_figures as pf  # noqa: E402
from test_predict_programs import predict  # noqa: E402

REAL_H200 = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_runs" / "h200-2026-11-27" / "predict_vs_real.json"
ALLOCATED, RESERVED = 0.02, 0.03


def _real(case: str) -> dict:
    real = json.loads(REAL_H200.read_text())["real"][case]
    assert real["device"] == "NVIDIA H200" and not real["error"]
    return real


def _torch_policy(p) -> dict:
    assert p.returncode == 0 and p.data is not None, p.why()
    return next(r for r in p.data["policies"] if r["policy"] == "torch")


def _errors(predicted: dict, real: dict) -> tuple[float, float]:
    return (predicted["peak_allocated"] / real["peak_allocated"] - 1,
            predicted["peak_reserved"] / real["peak_reserved"] - 1)


def test_nanogpt_compiled_is_within_issue_33s_targets_of_a_real_h200_run(tmp_path):
    """nanoGPT's train.py with its default compile=True (shakespeare_char, 3 iterations): real peak
    allocated 1,759,329,280 B, reserved 1,805,647,872 B. Predicted as eager (before compiled code was
    traced) it was +0.6% / +1.9%; as compiled, inductor's fused backward holds fewer temporaries."""
    real = _real("nanogpt-compiled")
    assert "--compile=False" not in real["args"]
    p = predict("train.py", real["args"], pf.nanogpt_workdir(tmp_path), tmp_path / "out", gpu="H200")
    assert "predicted as compiled (inductor)" in p.stdout + p.stderr
    allocated, reserved = _errors(_torch_policy(p), real)
    assert abs(allocated) <= ALLOCATED and abs(reserved) <= RESERVED, (f"{allocated:+.2%}", f"{reserved:+.2%}")


def test_compiled_model_and_optimizer_step_are_within_issue_33s_targets_of_a_real_h200_run(tmp_path):
    """tests/programs/compiled_step.py (width 4096, depth 8, batch 256, Adam; the model compiled and
    the optimizer step a compiled function): real peak allocated 2,225,691,136 B, reserved 2,302,672,896 B.
    Predicted with the step as eager foreach it was +23.9% / +25.1% (parameter-sized temporaries the
    compiled step does not make)."""
    real = _real("compiled_step")
    p = predict(real["script"], real["args"], pf.PROGRAMS, tmp_path / "out", gpu="H200")
    allocated, reserved = _errors(_torch_policy(p), real)
    assert abs(allocated) <= ALLOCATED and abs(reserved) <= RESERVED, (f"{allocated:+.2%}", f"{reserved:+.2%}")
