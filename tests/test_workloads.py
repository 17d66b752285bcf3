"""The bundled workloads are real torch models that run on a CPU, call on_step after each step,
and make the allocation patterns they are there for (recorded as `amem compare` records them)."""
import numpy as np
import pytest

from amem_alloc import replay, workloads
from amem_alloc.compare.recorder import _record, program_from_allocations

pytest.importorskip("torch")


def _steps(name, steps, **kw):
    """Per step: the allocation sizes the CPU allocator saw."""
    events, marks, _, info = _record(workloads.get(name), 1, steps, "cpu", 0)
    program, times, _ = program_from_allocations(events)
    cuts = [0] + [int(np.searchsorted(np.asarray(times), m, side="right")) for m in marks]
    ops = program.ops
    per_step = [ops[a:b][ops[a:b]["kind"] == replay.ALLOC]["size"].tolist() for a, b in zip(cuts, cuts[1:])]
    return per_step, info


def test_registry():
    assert set(workloads.WORKLOADS) == {"gpt", "mlp", "mlp-checkpoint", "decode", "fsdp", "moe", "pipeline", "serving"}
    with pytest.raises(ValueError, match="choose one of"):
        workloads.get("bert")


def test_gpt_changes_its_sequence_length_every_step():
    per_step, info = _steps("gpt", 3)
    assert len(per_step) == 3 and all(per_step)
    assert len(set(info["sequence_lengths"])) > 1 and info["layers"] == 2 and info["width"] == 128
    assert len({max(s) for s in per_step}) > 1  # other shapes each step


def test_mlp_with_checkpointing_recomputes():
    plain, info = _steps("mlp", 2)
    ckpt, info_c = _steps("mlp-checkpoint", 2)
    assert (info["batch"], info["width"], info["layers"]) == (64, 1024, 16) and info_c["checkpoint"]
    assert len(ckpt[1]) > len(plain[1])     # the recomputed forward allocates again during backward


def test_decode_grows_its_cache_every_token():
    per_step, info = _steps("decode", 4)
    assert len(per_step) == info["steps"] == 4
    assert max(per_step[-1]) > max(per_step[1])  # torch.cat makes a bigger cache each token (step 0 has the prompt)


def test_size_knob_scales():
    calls = []
    workloads.get("decode")(size=2, steps=2, on_step=calls.append)
    assert calls == [0, 1]
