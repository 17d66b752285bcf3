"""`amem predict --what-if` and predict(..., what_if=[...]): each change is applied by amem to an
unchanged program and the program predicted again; the answers are judged against the same
program with the change written by hand (tests/whatif_programs/), and against first principles.

* checkpoint=blocks on a Hugging Face GPT-2 (from a config, random init, GPT2Config's default
  use_cache=True) equals the model's own gradient_checkpointing_enable(use_reentrant=False) to the
  byte of peak allocated, in fp32 and under bf16 autocast, at 4 layers and at GPT-2 small's sizes
  (issue 32, item 7), holding one fp32 [B, S, 768] a block at the peak;
* checkpoint=blocks / checkpoint=sqrt on a deep MLP stack match hand-written per-block and
  per-segment (round(sqrt(L)) blocks) torch.utils.checkpoint;
* the activation part of the peak grows as L without checkpointing and as sqrt(L) with
  checkpoint=sqrt (depth x4: x4 and x2);
* optimizer=fused on a foreach AdamW program equals the program written with fused=True;
* grads=set-to-none frees what zero_grad(set_to_none=False) kept, and says so when there is nothing
  to change;
* the cheapest change that makes a run fit is named; bad input is one line.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import amem_alloc  # noqa: E402
from amem_alloc.predict.whatif import answers as whatif  # noqa: E402

HERE = Path(__file__).resolve().parent
PROGRAMS = HERE / "whatif_programs"
sys.path.insert(0, str(PROGRAMS))
import mlp_stack  # noqa: E402

MODEL_STATE = ("parameter", "gradient", "optimizer_state", "workspace")


def run_main(module, *argv):
    """A callable running module.main() with argv, for amem_alloc.predict."""
    def run():
        saved = sys.argv
        sys.argv = [module.__file__, *map(str, argv)]
        try:
            module.main()
        finally:
            sys.argv = saved
    return run


def mlp_step(depth: int, scheme: str = "none", batch: int = 4096, width: int = 256) -> None:
    model = mlp_stack.Stack(width, depth).cuda()
    x = torch.randn(batch, width, device="cuda")
    model(x, scheme).backward()


def peak(p, policy="torch") -> int:
    return p.row(policy).peak_allocated


def changed(p, change):
    return next(w for w in p.what_if if w.change == change)


# ============================================================================ checkpointing
GPT2_SMALL = ("--layers", 12, "--embd", 768, "--heads", 12, "--vocab", 50257, "--seq", 1024, "--batch", 16, "--bf16")


def _hf_lm(*argv):
    """(the prediction of hf_causal_lm.py with argv and checkpoint=blocks, its what-if, the
    prediction of the same script with the model's own gradient_checkpointing_enable
    (use_reentrant=False))."""
    hf = pytest.importorskip("transformers")
    assert hf
    import hf_causal_lm

    p = amem_alloc.predict(run_main(hf_causal_lm, *argv), policies="torch", what_if=["checkpoint=blocks"])
    own = amem_alloc.predict(run_main(hf_causal_lm, *argv, "--gradient-checkpointing"), policies="torch")
    return p, changed(p, "checkpoint=blocks"), own


def _hf_own_equals_what_if(w, own) -> None:
    """A first-principles comparison, not a calibration: both runs are the same
    torch.utils.checkpoint (non-reentrant) around each GPT2Block's forward with the hidden state as
    its input, called by the same GPT2Model loop under the same autocast, neither writing a KV
    cache: the model's own through GradientCheckpointingLayer, the what-if through amem's wrapper on
    the instance. Nothing that allocates differs, so the figures are equal to the byte."""
    assert w.failed is None and w.applied == 1 and w.stack == "transformer.h", w
    assert w.row("torch").peak_allocated == peak(own), (w.rows, own.rows)
    assert w.at_peak == own.at_peak.categories
    assert abs(w.row("torch").peak_reserved - own.row("torch").peak_reserved) <= 0.01 * own.row("torch").peak_reserved
    assert any("KV cache" in n for n in w.notes), w.notes   # GPT2Config's use_cache=True: the what-if dropped it


def test_checkpoint_blocks_matches_hugging_faces_own_gradient_checkpointing():
    p, w, own = _hf_lm("--layers", 4)                       # fp32, width 256, vocabulary 8192
    _hf_own_equals_what_if(w, own)
    assert w.blocks == 4 and peak(own) < peak(p)            # and checkpointing does save memory here
    assert 0 < w.recompute_flops <= w.forward_flops


def test_checkpoint_blocks_under_bf16_autocast_equals_the_models_own_and_keeps_one_tensor_a_block():
    """GPT-2 small's width, vocabulary and heads at 4 layers, batch 4, seq 256, bf16 autocast, with
    GPT2Config's default use_cache=True. The model's own checkpointing turns the KV cache off; a
    what-if that let the blocks write it kept each block's keys and values (2 bf16 [B, 12, S, 64]:
    one fp32 [B, S, 768]'s bytes) alive until backward: the peak was 15 MiB higher here, 1.0%,
    hence the exact comparison. By hand: at the peak (backward of the loss, before any block's),
    what the blocks made in forward and still hold is what checkpoint saved, each block's input,
    which is the previous block's output (the first block's comes from transformer.drop), plus the
    last block's output (ln_f's input): L fp32 [B, S, 768] residual-stream tensors (a bf16 branch
    added to the fp32 residual promotes to fp32), 3 MiB each, and no keys or values."""
    from amem_alloc.predict import api
    from amem_alloc.predict.whatif import changes, trial
    import hf_causal_lm

    layers, batch, seq, embd = 4, 4, 256, 768
    argv = ("--layers", layers, "--embd", embd, "--heads", 12, "--vocab", 50257, "--seq", seq, "--batch", batch,
            "--bf16")
    _, w, own = _hf_lm(*argv)
    _hf_own_equals_what_if(w, own)

    run = run_main(hf_causal_lm, *argv)
    again = trial.predict(lambda _: run(), api.predicting, own.gpu, api.resolve_policies("torch"), "hf_causal_lm",
                          change=changes.make("checkpoint=blocks"))   # the what-if's run, with its storages
    assert again.row("torch").peak_allocated == w.row("torch").peak_allocated and again.at_peak.phase == "backward"
    held = [n for key, n in again.at_peak.live.items() if again.infos[key].category == "activation"
            and (again.infos[key].module or "").startswith("transformer.h.") and again.infos[key].phase == "forward"]
    assert sorted(held) == [batch * seq * embd * 4] * layers, held


def test_checkpoint_blocks_at_gpt2_small_equals_the_models_own_checkpointing():
    """Issue 32, item 7, at its sizes: GPT-2 small, batch 16, seq 1024, bf16 autocast, AdamW (a few
    seconds here: a prediction, no GPU). It was 11.94 GiB against 11.38 GiB (+576 MiB: 12 blocks x
    48 MiB of keys and values)."""
    p, w, own = _hf_lm(*GPT2_SMALL)
    _hf_own_equals_what_if(w, own)
    assert w.blocks == 12 and peak(own) < peak(p) / 1.5


def test_a_checkpointed_block_is_called_without_its_kv_cache():
    """As transformers' GradientCheckpointingLayer sets them: use_cache False and the cache None,
    positional (GPT2Model passes it second) or keyword; a layer that only reads its cache
    (_can_checkpoint_with_cache) keeps it; a call that asked for no cache is left as it was."""
    from amem_alloc.predict.whatif.changes import _no_cache

    class Layer(torch.nn.Module):
        def forward(self, x, cache=None, mask=None, use_cache=False, **kwargs):
            return x
    layer, x, cache = Layer(), torch.ones(1), object()
    strip = _no_cache(layer, layer.forward)
    assert strip((x, cache, None), {"use_cache": True}) == ((x, None, None), {"use_cache": False}, True)
    assert strip((x,), {"cache": cache, "layer_past": cache}) == ((x,), {"cache": None, "layer_past": None}, True)
    assert strip((x, None), {"mask": x, "use_cache": False}) == ((x, None), {"mask": x, "use_cache": False}, False)
    layer._can_checkpoint_with_cache = True
    assert _no_cache(layer, layer.forward)((x, cache), {"use_cache": True}) == ((x, cache), {"use_cache": False}, True)


@pytest.mark.parametrize("depth", [16, 64])
def test_checkpoint_schemes_match_hand_written_checkpointing(depth):
    p = amem_alloc.predict(mlp_step, depth, policies="torch", what_if="checkpoint=blocks,checkpoint=sqrt")
    for scheme in ("blocks", "sqrt"):
        by_hand = amem_alloc.predict(mlp_step, depth, scheme, policies="torch")
        w = changed(p, f"checkpoint={scheme}")
        assert w.row("torch").peak_allocated == pytest.approx(peak(by_hand), rel=0.005), (scheme, w.rows)
    assert changed(p, "checkpoint=sqrt").segment == round(depth ** 0.5)


def _activations(categories: dict) -> int:
    return sum(v for k, v in categories.items() if k not in MODEL_STATE)


def test_activation_part_falls_from_order_L_to_order_sqrt_L():
    """The activation part of the peak (all but parameters, gradients, optimizer state, workspaces)
    at depths 16, 64, 256: its growth from 64 to 256 over its growth from 16 to 64 is 4 when it is
    O(L) (192/48), 2 when it is O(sqrt(L)) (8/4), whatever the constant part."""
    plain, sqrt = [], []
    for depth in (16, 64, 256):
        p = amem_alloc.predict(mlp_step, depth, policies="torch", what_if="checkpoint=sqrt")
        plain.append(_activations(p.at_peak.categories))
        sqrt.append(_activations(changed(p, "checkpoint=sqrt").at_peak))
    growth = [(a[2] - a[1]) / (a[1] - a[0]) for a in (plain, sqrt)]
    assert 3.7 <= growth[0] <= 4.3, (plain, growth)
    assert 1.6 <= growth[1] <= 2.6, (sqrt, growth)
    assert sqrt[2] < plain[2] / 10


def test_checkpoint_needs_a_block_stack_or_says_so():
    def flat():
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()).cuda()
        model(torch.randn(8, 64, device="cuda")).sum().backward()
    p = amem_alloc.predict(flat, policies="torch", what_if="checkpoint=blocks")
    w = changed(p, "checkpoint=blocks")
    assert w.applied == 0 and "--blocks PATH" in w.notes[0]
    named = amem_alloc.predict(mlp_step, 4, policies="torch", what_if="checkpoint=blocks", blocks="blocks")
    assert changed(named, "checkpoint=blocks").stack == "blocks"


def test_blocks_whose_forward_never_runs_are_said_to_and_cost_nothing():
    """Failed at 9534256: vit-pytorch's and x-transformers' stacks are ModuleLists of ModuleLists
    that the model iterates itself (`for attn, ff in self.layers:`); wrapping the blocks changed
    nothing, and the what-if said it recomputes 0.0 MFLOP, saving 0 B, as if checkpointed."""
    class Pairs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.ModuleList([torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)])
                                               for _ in range(4)])

        def forward(self, x):
            for a, b in self.layers:
                x = b(torch.relu(a(x))) + x
            return x

    def pairs():
        Pairs().cuda()(torch.randn(8, 64, device="cuda")).sum().backward()
    p = amem_alloc.predict(pairs, policies="torch", what_if="checkpoint=blocks")
    w = changed(p, "checkpoint=blocks")
    assert w.applied == 0 and any("were never called" in n for n in w.notes), w.notes


def test_blocks_the_script_checkpoints_or_runs_without_grad_are_said_and_not_counted():
    """TRL's DPO: the policy's layers checkpoint themselves (transformers' gradient_checkpointing),
    the reference model's run under no_grad. checkpoint=blocks claimed "+32% compute, 16 blocks"
    with a saving of 0 B: each is said now, and no block is counted as checkpointed."""
    class Block(torch.nn.Module):
        def __init__(self, own: bool):
            super().__init__()
            self.a, self.b = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)
            self.gradient_checkpointing = own

        def forward(self, x):
            return self.b(torch.relu(self.a(x))) + x

    class Model(torch.nn.Module):
        def __init__(self, own: bool):
            super().__init__()
            self.layers = torch.nn.ModuleList([Block(own) for _ in range(4)])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    def dpo_like():
        policy, reference = Model(own=True).cuda(), Model(own=False).cuda()
        x = torch.randn(8, 64, device="cuda")
        with torch.no_grad():
            reference(x)
        policy(x).sum().backward()
    p = amem_alloc.predict(dpo_like, policies="torch", what_if="checkpoint=blocks")
    w = changed(p, "checkpoint=blocks")
    assert w.applied == 0 and w.blocks == 0, (w.applied, w.blocks, w.notes)
    assert any("already checkpoints each block of layers" in n for n in w.notes), w.notes
    assert any("ran only without grad" in n for n in w.notes), w.notes


# ============================================================================ optimizer, gradients
def test_optimizer_fused_equals_the_program_written_with_fused():
    sys.path.insert(0, str(HERE / "programs"))
    try:
        import fused_adamw
    finally:
        sys.path.remove(str(HERE / "programs"))
    p = amem_alloc.predict(run_main(fused_adamw, "--impl", "foreach"), policies="torch",
                           what_if="optimizer=fused,optimizer=for-loop")
    fused = amem_alloc.predict(run_main(fused_adamw, "--impl", "fused"), policies="torch")
    w = changed(p, "optimizer=fused")
    assert w.applied == 1 and w.row("torch").peak_allocated == peak(fused)
    loop = changed(p, "optimizer=for-loop")
    assert loop.applied == 1 and loop.row("torch").peak_allocated <= peak(p)


def test_grads_set_to_none_frees_what_zeroing_in_place_kept():
    def step():
        model = mlp_stack.Stack(256, 8).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            model(torch.randn(64, 256, device="cuda")).backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
        model(torch.randn(8192, 256, device="cuda"))   # the peak: gradients kept (in place) or gone (None)
    p = amem_alloc.predict(step, policies="torch", what_if="grads=set-to-none")
    w = changed(p, "grads=set-to-none")
    assert w.applied == 2
    grads = sum((pr.numel() * 4 + 511) // 512 * 512 for pr in mlp_stack.Stack(256, 8).parameters())
    assert p.at_peak.categories["gradient"] == grads and w.at_peak.get("gradient", 0) == 0
    assert peak(p) - w.row("torch").peak_allocated == grads

    def already():
        model = torch.nn.Linear(64, 64).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(8, 64, device="cuda")).sum().backward()
        opt.step()
        opt.zero_grad()
    q = amem_alloc.predict(already, policies="torch", what_if="grads=set-to-none")
    assert "nothing changed" in changed(q, "grads=set-to-none").notes[0]


# ============================================================================ the answer
def test_cheapest_change_that_makes_it_fit_is_named(tmp_path):
    base = amem_alloc.predict(mlp_step, 64, policies="torch")
    sqrt = amem_alloc.predict(mlp_step, 64, "sqrt", policies="torch")
    card = (base.row("torch").min_capacity + sqrt.row("torch").min_capacity) / 2 / 2**30   # usable: all of it
    p = amem_alloc.predict(mlp_step, 64, capacity_gb=card, policies="torch",
                           what_if="grads=set-to-none,checkpoint=sqrt")
    assert not p.row("torch").fits
    assert whatif.cheapest(p, p.what_if) == {"torch": "checkpoint=sqrt"}
    text = amem_alloc.format_prediction(p)
    assert "cheapest change that makes it fit under torch: checkpoint=sqrt" in text
    data = json.loads(p.write_json(tmp_path / "p.json").read_text())
    assert data["cheapest_change"] == {"torch": "checkpoint=sqrt"}
    row = data["what_if"][1]["policies"][0]
    assert row["fits"] is True and row["saving_reserved"] == base.row("torch").peak_reserved - row["peak_reserved"]


@pytest.mark.parametrize("args, needle, launcher", [
    (["--what-if", "checkpoint=every"], "unknown what-if 'checkpoint=every'", ["python"]),
    (["--blocks", "h"], "give --what-if too", ["python"]),
    # a distributed job's what-if was dropped without a word (no trial, no note)
    (["--what-if", "all"], "--what-if predicts one process, not the 2 ranks", ["torchrun", "--nproc_per_node", "2"]),
])
def test_bad_what_if_is_one_line(args, needle, launcher):
    proc = subprocess.run([sys.executable, "-m", "amem_alloc", "predict", *args, "--", *launcher,
                           str(PROGRAMS / "mlp_stack.py")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_blocks_called_out_of_order_make_sqrt_say_so():
    class Reversed(mlp_stack.Stack):
        def forward(self, x, scheme="none"):
            for b in reversed(self.blocks):
                x = b(x)
            return self.head(x).mean()

    def step():
        Reversed(64, 4).cuda()(torch.randn(8, 64, device="cuda")).backward()
    p = amem_alloc.predict(step, policies="torch", what_if="checkpoint=sqrt,checkpoint=blocks")
    assert "not called in order" in changed(p, "checkpoint=sqrt").failed
    assert changed(p, "checkpoint=blocks").failed is None       # per-block checkpointing needs no order


def test_the_cli_what_if_json(tmp_path):
    out = tmp_path / "p.json"
    proc = subprocess.run([sys.executable, "-m", "amem_alloc", "predict", "--policy", "torch,amem", "--steps", "1",
                           "--what-if", "checkpoint=blocks", "--json", str(out), "--", "python",
                           str(PROGRAMS / "mlp_stack.py"), "--depth", "4"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    (w,) = data["what_if"]
    assert w["change"] == "checkpoint=blocks" and [r["policy"] for r in w["policies"]] == ["torch", "amem"]
    assert w["recompute"]["stack"] == "blocks" and w["recompute"]["flops"] > 0
    assert "What if" in proc.stdout and "Verdict for" in proc.stdout


def test_blocks_that_are_no_chain_make_sqrt_say_so():
    """Failed at 9534256: a UNet's up-blocks concatenate a skip before each block; sqrt's segment ran
    a block on the previous one's output, torch raised inside amem's segment, and the row read
    "the script failed"."""
    class Skips(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(128, 64) for _ in range(4)])

        def forward(self, x, skips):
            for block, skip in zip(self.blocks, skips):
                x = block(torch.cat([x, skip], -1))
            return x

    def step():
        skips = [torch.randn(8, 64, device="cuda") for _ in range(4)]
        Skips().cuda()(torch.randn(8, 64, device="cuda"), skips).sum().backward()
    p = amem_alloc.predict(step, policies="torch", what_if="checkpoint=sqrt")
    w = changed(p, "checkpoint=sqrt")
    assert w.failed and "are not a chain" in w.failed, w.failed


def test_a_script_that_fails_only_under_a_change_says_the_change_failed(tmp_path):
    script = tmp_path / "grads.py"
    script.write_text(
        "import torch\n"
        "m = torch.nn.Linear(64, 64).cuda()\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(2):\n"
        "    m(torch.randn(8, 64, device='cuda')).sum().backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad(set_to_none=False)\n"
        "    m.weight.grad.mul_(0.5)   # None once zero_grad sets gradients to None\n")
    proc = subprocess.run([sys.executable, "-m", "amem_alloc", "predict", "--policy", "torch",
                           "--what-if", "grads=set-to-none", "--", "python", str(script)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "grads=set-to-none: the script failed with the change applied (exit status 1), not without it" \
        in proc.stdout, proc.stdout[-3000:]


LOGGING = """
import logging, sys, torch
logging.basicConfig(level=logging.INFO, format="%(message)s")
log = logging.getLogger("train")
log.addHandler(logging.FileHandler(sys.argv[1]))
model = torch.nn.Linear(64, 64).cuda()
opt = torch.optim.AdamW(model.parameters())
for step in range(2):
    model(torch.randn(8, 64, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
    log.info("logged step %d", step)
"""


def test_each_run_logs_each_line_once(tmp_path):
    """The handlers the script added stayed for the next run in the process, which added its own:
    with --what-if all the sixth run printed each line six times, and wrote them so to its file.
    Now each run's handlers go as it ends (predict/script_logging.py), its file closed."""
    script, log = tmp_path / "logging_script.py", tmp_path / "train.log"
    script.write_text(LOGGING)
    proc = subprocess.run([sys.executable, "-m", "amem_alloc", "predict", "--policy", "torch", "--what-if", "all",
                           "--", "python", str(script), str(log)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = 1 + len(whatif.NAMES)
    printed = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("logged step")]
    assert sorted(printed) == sorted(["logged step 0", "logged step 1"] * runs), printed
    # each trial wrote its own log, set aside as the next began; the first run's is back (run_files.py)
    assert log.read_text().splitlines() == ["logged step 0", "logged step 1"]


def test_every_stack_of_layered_blocks_is_checkpointed_not_only_the_one_with_most_parameters():
    """A ResNet's four stages are four stacks: the largest by parameters (layer4) holds the least
    activation, and checkpoint=blocks chose it alone (ResNet-50: 118 MiB saved where the first stage
    alone saves 2.31 GiB). Every stack of blocks built of layers is taken, none inside another (a MoE
    layer's experts); a model with only a list of Linear layers has that list taken."""
    torchvision = pytest.importorskip("torchvision")
    from torch import nn

    from amem_alloc.predict.whatif.changes import find_blocks

    stacks = find_blocks(torchvision.models.resnet18())
    assert [(name, len(blocks)) for name, blocks in stacks] == [("layer1", 2), ("layer2", 2), ("layer3", 2), ("layer4", 2)]

    class Expert(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(8, 32), nn.Linear(32, 8)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn, self.norm = nn.Linear(8, 8), nn.LayerNorm(8)
            self.experts = nn.ModuleList([Expert() for _ in range(4)])

    model = nn.Module()
    model.layers = nn.ModuleList([Block() for _ in range(3)])
    assert [(name, len(blocks)) for name, blocks in find_blocks(model)] == [("layers", 3)]
    heads = nn.Module()
    heads.small = nn.ModuleList([nn.Linear(2, 2) for _ in range(2)])
    heads.large = nn.ModuleList([nn.Linear(64, 64) for _ in range(3)])
    assert [name for name, _ in find_blocks(heads)] == ["large"]
    assert find_blocks(heads, "missing") == [] and [n for n, _ in find_blocks(model, "layers.0.experts")] == ["layers.0.experts"]
