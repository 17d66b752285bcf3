"""The bundled workloads are real torch models that call on_step after each step and make the
allocation patterns they are there for (recorded as `amem compare` records them without a GPU:
by prediction, on fake CUDA tensors)."""
import pytest

from amem_alloc import replay, workloads

pytest.importorskip("torch")


def _steps(name, steps, **kw):
    """Per step: the allocation sizes CUDA's caching allocator would be asked for."""
    from amem_alloc.predict.api import predicting

    with predicting(policies=[], analyse=False) as run:
        info = workloads.get(name)(1, steps, "cuda", 0, lambda i: run.marker("step"))
    cuts = [0] + [i for i, name in run.recording.markers if name == "step"]
    per_step = [[size for kind, _, size, _ in run.recording.ops[a:b] if kind == replay.ALLOC] for a, b in zip(cuts, cuts[1:])]
    return per_step, info


def test_registry():
    assert set(workloads.WORKLOADS) == {"gpt", "mlp", "mlp-checkpoint", "decode", "llama7b", "fsdp", "moe", "pipeline",
                                        "serving"}
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


def test_llama_is_7b_and_runs_small_on_a_cpu():
    from amem_alloc.workloads import llama

    assert 6.7e9 < llama.LLAMA_7B.parameters < 6.8e9          # LLaMA-7B: 6.74e9
    calls = []
    info = llama.run(size=2, steps=1, on_step=calls.append, config=llama.LlamaConfig(1, 64, 2, 128, 100, 16))
    assert calls == [0] and info["batch"] == 2 and info["parameters"] == llama.LlamaConfig(1, 64, 2, 128, 100, 16).parameters


def test_size_knob_scales():
    calls = []
    workloads.get("decode")(size=2, steps=2, on_step=calls.append)
    assert calls == [0, 1]
