"""torchtitan, unchanged, from the package index: its Llama 3 debug model (FlexAttention, selective
activation checkpointing, FSDP2 built on meta) on 2 ranks under `amem predict -- torchrun -m
torchtitan.train`, as its README launches it.

The model state each rank holds is checked against first principles: torchtitan's own model,
built on meta from its own config (no memory), gives every parameter's shape; FSDP2 gives each
rank dim 0 rounded up to a multiple of the world size, divided by it (one allocation per
parameter, float32); gradients are those shards again and AdamW's state two of each plus a
float32 step per parameter (torchtitan's optimizer keeps its steps on the device). Every number
below is computed from those rules, none from amem.

No internet: the test writes torchtitan's tokenizer files (a byte-level BPE trained here with
`tokenizers`) and a c4_test-style JSON-lines file into the working folder; memory does not depend
on the text.
"""
from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan.train")
tokenizers = pytest.importorskip("tokenizers")

AMEM = [sys.executable, "-m", "amem_alloc"]
WORLD = 2
WORDS = "the model rank shard gradient weight optimizer token batch memory cache attention block".split()


def _write_assets(root: Path) -> None:
    """tests/assets/c4_test/data.json and tests/assets/tokenizer/ as torchtitan's tests have them."""
    rng = random.Random(0)
    lines = [" ".join(f"{rng.choice(WORDS)}{rng.randrange(300)}" for _ in range(400)) for _ in range(200)]
    c4 = root / "tests/assets/c4_test"
    c4.mkdir(parents=True)
    (c4 / "data.json").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<unk>"]
    tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=600, special_tokens=specials,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    folder = root / "tests/assets/tokenizer"
    folder.mkdir(parents=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": specials[0], "eos_token": specials[1], "add_bos_token": True}))


def _shapes(flavor: str) -> list[tuple[int, ...]]:
    """Every parameter's shape in a torchtitan Llama 3 model, built on meta from its own config."""
    from torchtitan.models.llama3 import model_registry

    with torch.device("meta"):
        model = model_registry(flavor).model.build()
    return [tuple(p.shape) for p in model.parameters()]


def _rounded(nbytes: int) -> int:
    return max(512, (nbytes + 511) // 512 * 512)   # the caching allocator's 512-byte rounding


def _shard_bytes(shape: tuple[int, ...], world: int) -> int:
    rows = math.ceil(shape[0] / world)
    return _rounded(rows * math.prod(shape[1:]) * 4)


def _predict(root: Path, world: int, config: list[str]) -> tuple[dict, str]:
    out = root / f"prediction-{world}.json"
    cmd = [*AMEM, "predict", "--gpu", "H100", "--policy", "torch", "--json", str(out), "--",
           "torchrun", "--nproc-per-node", str(world), "-m", "torchtitan.train", "--module", "llama3", *config]
    run = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(out.read_text()), run.stdout


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("torchtitan")
    _write_assets(root)
    return root


@pytest.fixture(scope="module")
def prediction(assets):
    return _predict(assets, WORLD, ["--config", "llama3_debugmodel", "--training.steps", "2"])


def _assert_model_state(data: dict, flavor: str, world: int) -> None:
    shards = [_shard_bytes(s, world) for s in _shapes(flavor)]
    for r in data["ranks"]:
        held = r["at_peak"]
        assert held["gradient"] == sum(shards)
        assert held["optimizer_state"] == 2 * sum(shards) + len(shards) * 512


def test_every_rank_holds_its_fsdp2_shard_of_parameters_gradients_and_adamw_state(prediction):
    data, _ = prediction
    assert [r["rank"] for r in data["ranks"]] == list(range(WORLD))
    _assert_model_state(data, "debugmodel", WORLD)


def test_flex_attention_is_modelled_and_nothing_is_sequence_squared(prediction):
    """The debug model's attention is FlexAttention (seq 2048, 16 heads, local batch 8): no
    allocation of size S x S per head, as the fused kernel has none; compiling flex_attention is
    not said to run as eager; the run is not said to fail."""
    data, text = prediction
    seq, heads, batch = 2048, 16, 8
    for r in data["ranks"]:
        for block in r["at_peak_largest"]:
            assert block["bytes"] < batch * heads * seq * seq // 4
        assert f"torchtitan/models/common/attention.py:{_flex_compile_line()}" not in \
            [n.get("where") for n in r["notes"] if n["what"].startswith("torch.compile")]
    assert "the script failed" not in text


def _flex_compile_line() -> int:
    """The line of torchtitan's `torch.compile(flex_attention, ...)`."""
    import torchtitan.models.common.attention as attention

    lines = Path(attention.__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if "torch.compile(" in line and "flex_attention" in lines[i])


@pytest.fixture(scope="module")
def compiled_prediction(assets):
    return _predict(assets, WORLD, ["--config", "llama3_debugmodel", "--training.steps", "2", "--compile.enable"])


def _line_of(module, text: str) -> str:
    """torchtitan's file (as the notes name it) and the line holding `text`."""
    import torchtitan

    path = Path(module.__file__)
    line = next(i for i, src in enumerate(path.read_text().splitlines(), 1) if text in src)
    return f"torchtitan/{path.relative_to(Path(torchtitan.__file__).parent)}:{line}"


def test_compile_enable_predicts_each_block_and_the_loss_as_compiled_as_torchs_partition_saves(compiled_prediction):
    """`--compile.enable` (torchtitan 0.3: each TransformerBlock through `nn.Module.compile`, after
    selective activation checkpointing and before FSDP2, and the loss function): the same FSDP2
    shards of parameters, gradients and AdamW state as uncompiled; FSDP2's hooks on each block run
    eager around its compiled forward, as torch runs them (dynamo never traces them), so each
    block is predicted as compiled and saves for backward, to the byte, what torch's partition
    saves for torchtitan's block (compiled_reference.py: SelectiveAC's policy, FlexAttention with
    the document mask, bf16 parameters); the loss likewise. Only create_block_mask's region runs
    eager, said at its call (its result is a BlockMask)."""
    import compiled_reference
    import torchtitan.distributed.compile as compile_
    from torchtitan.models.llama3 import config_registry

    data, text = compiled_prediction
    _assert_model_state(data, "debugmodel", WORLD)
    cfg = config_registry.llama3_debugmodel()
    want = [sum(g) for g in compiled_reference.torchtitan_block_saved("debugmodel", cfg.training.local_batch_size,
                                                                        cfg.training.seq_len)]
    assert len(want) == 1 and want[0] > 0, want
    layers = len(cfg.model_spec.model.layers)
    blocks_line = _line_of(compile_, "transformer_block.compile(")
    for r in data["ranks"]:
        blocks = [c for c in r["compiled_regions"] if c["region"] == "FSDPCheckpointWrapper"]
        assert len(blocks) == layers, r["compiled_regions"]
        for block in blocks:
            assert block["status"] == "predicted as compiled (inductor)", block
            assert [g["saved_bytes"] for g in block["graphs"]] == want, (block, want)
        notes = [n for n in r["notes"] if n["what"].startswith("torch.compile")]
        assert not [n for n in notes if n["where"] == blocks_line], notes   # no fallback at compile()
        eager = [n for n in notes if n["kind"] == "not-modelled"]
        assert [n["what"].split(":")[0] for n in eager] == ["torch.compile region create_block_mask"], eager
    assert "the script failed" not in text
    _assert_loss_saves_what_torchs_partition_saves(data, "llama3_debugmodel")


def _assert_loss_saves_what_torchs_partition_saves(data: dict, config: str) -> None:
    """The compiled loss (`cross_entropy_loss`, called on each of the chunked loss's chunks of the
    model's output: `num_chunks` along the sequence) is predicted as compiled on every rank and saves
    for backward, to the byte, what torch's partition saves for one chunk (compiled_reference.py,
    AOTAutograd with inductor's partition run directly on CPU fakes)."""
    import compiled_reference
    from torchtitan.models.llama3 import config_registry

    cfg = getattr(config_registry, config)()
    chunk = cfg.training.seq_len // cfg.loss.num_chunks
    dtype = getattr(torch, cfg.training.mixed_precision_param)
    want = sum(compiled_reference.torchtitan_loss_saved(cfg.training.local_batch_size, chunk,
                                                        cfg.model_spec.model.vocab_size, dtype))
    for r in data["ranks"]:
        loss = [c for c in r["compiled_regions"] if c["region"] == "cross_entropy_loss"]
        assert len(loss) == 1 and loss[0]["status"] == "predicted as compiled (inductor)", r["compiled_regions"]
        assert loss[0]["saved_bytes"] == want > 0, (loss, want)


@pytest.mark.slow
def test_the_8b_config_compiled_on_8_ranks_saves_in_its_loss_what_torchs_partition_saves(assets):
    """torchtitan's Llama 3.1 8B config with `--compile.enable` on 8 ranks: the model state as
    uncompiled (each rank's FSDP2 shard), every block predicted as compiled, and the compiled loss,
    on rank 0 and every rank, saving what torch's partition saves for each chunk of the (1, 8192,
    128,256) bf16 output."""
    data, text = _predict(assets, 8, ["--config", "llama3_8b", "--hf_assets_path", "./tests/assets/tokenizer",
                                      "--dataloader.dataset", "c4_test", "--training.steps", "2", "--compile.enable"])
    assert [r["rank"] for r in data["ranks"] if r["recorded"]] == [0, 7]
    _assert_model_state(data, "8B", 8)
    _assert_loss_saves_what_torchs_partition_saves(data, "llama3_8b")
    for r in data["ranks"]:
        blocks = [c for c in r["compiled_regions"] if c["region"] == "FSDPCheckpointWrapper"]
        assert len(blocks) == 32 and all(b["status"] == "predicted as compiled (inductor)" for b in blocks), blocks
    assert "the script failed" not in text


@pytest.mark.slow
def test_the_8b_config_on_8_ranks_holds_each_ranks_shard_of_the_model_state(assets):
    """torchtitan's Llama 3.1 8B config (local batch 1, seq 8192, FlexAttention, selective AC) on 8
    ranks: ranks 0 and 7 recorded, the others taken as rank 0's; each holds 1/8 of the 8.03 B
    parameters' gradients and twice that in AdamW state, from torchtitan's own model."""
    data, _ = _predict(assets, 8, ["--config", "llama3_8b", "--hf_assets_path", "./tests/assets/tokenizer",
                                   "--dataloader.dataset", "c4_test", "--training.steps", "2"])
    assert [r["rank"] for r in data["ranks"] if r["recorded"]] == [0, 7]
    _assert_model_state(data, "8B", 8)
