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


def _shapes() -> list[tuple[int, ...]]:
    """Every parameter's shape in torchtitan's debug model, built on meta from its own config."""
    from torchtitan.models.llama3 import model_registry

    with torch.device("meta"):
        model = model_registry("debugmodel").model.build()
    return [tuple(p.shape) for p in model.parameters()]


def _rounded(nbytes: int) -> int:
    return max(512, (nbytes + 511) // 512 * 512)   # the caching allocator's 512-byte rounding


def _shard_bytes(shape: tuple[int, ...]) -> int:
    rows = math.ceil(shape[0] / WORLD)
    return _rounded(rows * math.prod(shape[1:]) * 4)


@pytest.fixture(scope="module")
def prediction(tmp_path_factory):
    root = tmp_path_factory.mktemp("torchtitan")
    _write_assets(root)
    out = root / "prediction.json"
    cmd = [*AMEM, "predict", "--gpu", "H100", "--policy", "torch", "--json", str(out), "--",
           "torchrun", "--nproc-per-node", str(WORLD), "-m", "torchtitan.train",
           "--module", "llama3", "--config", "llama3_debugmodel", "--training.steps", "2"]
    run = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(out.read_text()), run.stdout


def test_every_rank_holds_its_fsdp2_shard_of_parameters_gradients_and_adamw_state(prediction):
    data, _ = prediction
    shards = [_shard_bytes(s) for s in _shapes()]
    ranks = data["ranks"]
    assert [r["rank"] for r in ranks] == list(range(WORLD))
    for r in ranks:
        held = r["at_peak"]
        assert held["gradient"] == sum(shards)
        assert held["optimizer_state"] == 2 * sum(shards) + len(shards) * 512


def test_flex_attention_is_modelled_and_nothing_is_sequence_squared(prediction):
    """The debug model's attention is FlexAttention (seq 2048, 16 heads, local batch 8): no
    allocation of size S x S per head, as the fused kernel has none; the run is not said to fail."""
    data, text = prediction
    seq, heads, batch = 2048, 16, 8
    for r in data["ranks"]:
        for block in r["at_peak_largest"]:
            assert block["bytes"] < batch * heads * seq * seq // 4
    assert "the script failed" not in text
