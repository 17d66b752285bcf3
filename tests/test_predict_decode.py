"""Decode loops (amem_alloc/predict/decode_loop.py): generate() and a user's own loop end after a few
steps and the steps left are written out, growing as the KV cache does. Checked op for op against the
same script with every step run, and against first principles (weights, KV cache)."""
from __future__ import annotations

import gc
import textwrap

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from amem_alloc import replay  # noqa: E402
from amem_alloc.predict import api, repeat  # noqa: E402
from amem_alloc.predict import script as script_mod  # noqa: E402

# a small GQA Llama: 2 layers, 4 heads of 32, 2 KV heads; bf16
MODEL = textwrap.dedent("""
    import sys, torch
    from transformers import LlamaConfig, LlamaForCausalLM
    B, P, N = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    cfg = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048)
    with torch.device("cuda"):
        model = LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16)
    model.eval()
    torch.manual_seed(0)   # the same prompt in every run compared (not the test process's RNG state)
    ids = torch.randint(0, 512, (B, P)).cuda()
""")
GENERATE = MODEL + textwrap.dedent("""
    kw = {"static": {"cache_implementation": "static"}, "beam": {"num_beams": 3},
          "sample": {"do_sample": True, "top_k": 50}}.get(sys.argv[4], {})
    if sys.argv[4] == "assisted":   # speculative decoding: a step adds the accepted candidates and one more
        with torch.device("cuda"):
            kw["assistant_model"] = LlamaForCausalLM._from_config(
                LlamaConfig(**{**cfg.to_dict(), "num_hidden_layers": 1}), dtype=torch.bfloat16).eval()
    kw.setdefault("do_sample", False)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N, **kw)
    open(sys.argv[0] + ".length", "w").write(str(out.shape[-1]))   # what the program sees of the generation
""")
USER_LOOP = MODEL + textwrap.dedent("""
    from transformers import DynamicCache
    with torch.inference_mode():
        cache = DynamicCache(config=cfg)
        out = model(ids, past_key_values=cache, use_cache=True)
        tok = out.logits[:, -1:].argmax(-1)
        for i in range(N):
            out = model(tok, past_key_values=cache, use_cache=True)
            tok = out.logits[:, -1:].argmax(-1)
        last = torch.cat([ids, tok], dim=1)
""")
LAYERS, KV_HEADS, HEAD_DIM, BF16 = 2, 2, 32, 2
PARAMS = 512 * 128 * 2 + LAYERS * (128 * 128 * 2 + 2 * 128 * 64 + 3 * 128 * 256 + 2 * 128) + 128


@pytest.fixture(scope="module")
def _imported(tmp_path_factory):
    """generate() run once first: the lazy imports it makes in a fresh process raise and catch
    exceptions whose tracebacks hold the script's frame (a cycle), which only a process's first
    run pays."""
    _run(tmp_path_factory.mktemp("imports"), GENERATE, (1, 4, 2, "static"))


@pytest.fixture(autouse=True)
def _collector_held_still(_imported):
    """Tests here compare two runs' ops one for one. A tensor that only Python's cycle collector
    frees (torch.compile's tracing leaves cycles of its frames holding their inputs, in a real run
    as under prediction: transformers compiles a static cache's forward) is freed wherever the
    collector happens to run, which depends on everything the process made before (amem notes
    it: engine/collector.py); the collector is held still for the test so that both runs keep them
    alike."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _run(tmp_path, source, args, write_decode=True, gpu="H100", shapes="expected"):
    script = tmp_path / "decode.py"
    script.write_text(source)
    run = api.predicting(gpu, policies=["torch"], write_decode=write_decode, shapes=shapes)
    with run:
        script_mod.run([str(script), *map(str, args)], run, 0, 600)
    return run


def _normalised(ops):
    """Blocks and CUDA graph pools named in order of appearance (their numbers count across the
    process's predictions)."""
    names: dict[int, int] = {}
    pools: dict[int, int] = {}
    return [(kind, names.setdefault(key, len(names)) if kind <= 1 else
             pools.setdefault(key, len(pools)) if kind >= replay.POOL_BEGIN else key, size, stream)
            for kind, key, size, stream in ops]


def _written(run):
    return [n for n in run.recorded.notes if n["kind"] == "written-out"]


def _as_run_to_the_end(ops, sequence_bytes):
    """A written-out generate()'s ops as the run with every step made them: the sequences generate
    returns are lengthened by the steps written out (decode_loop._lengthened), one allocation as
    generate returns, after which the short sequences' block (the written-out last step's, as
    long) is freed; that block is the one the run keeps, the lengthened one is not."""
    at = max(i for i, (kind, _, size, _) in enumerate(ops) if kind == replay.ALLOC and size == sequence_bytes)
    longer = ops[at][1]
    freed = next(i for i in range(at + 1, len(ops)) if ops[i][0] == replay.FREE)
    kept = ops[freed][1]
    return [(kind, kept if key == longer else key, size, stream)
            for i, (kind, key, size, stream) in enumerate(ops) if i not in (at, freed)]


@pytest.mark.parametrize("cache", ["dynamic", "static", "beam", "sample"])
def test_generate_writes_out_the_decode_steps_exactly_as_running_them_records(tmp_path, cache):
    args = (2, 16, 20, cache)
    length = tmp_path / "decode.py.length"
    short = _run(tmp_path, GENERATE, args)
    short_length = int(length.read_text())
    full = _run(tmp_path, GENERATE, args, write_decode=False)
    assert len(_written(short)) == 1 and not _written(full)
    ran = int(_written(short)[0]["what"].split(": ")[1].split()[0])
    left = int(_written(short)[0]["what"].split(" the ")[1].split()[0])
    assert ran < 10 and ran + left == 20   # a prefill, a warm-up and repeat.GROW_RUN steps alike; 20 asked
    assert short_length == int(length.read_text()) == 16 + 20   # generate() returned the run's length either way
    assert _normalised(_as_run_to_the_end(short.recorded.ops, 2 * (16 + 20) * 8)) == _normalised(full.recorded.ops)
    assert short.result.rows[0].peak_reserved == full.result.rows[0].peak_reserved
    # the end of sequence is taken as never met, so generate() ran to max_new_tokens in both
    assert any(n["kind"] == "upper-bound" and "EosTokenCriteria" in n["what"] for n in short.recorded.notes)


def test_assisted_decoding_writes_out_steps_of_several_tokens_as_running_them_does(tmp_path):
    """Failed at 9534256: the steps left were the tokens left, while each assisted step adds the
    accepted candidates and one more (2 here): 40 tokens asked were written out as 40 steps of
    2, a KV cache twice the run's."""
    args = (1, 16, 40, "assisted")
    length = tmp_path / "decode.py.length"
    short = _run(tmp_path, GENERATE, args)
    short_length = int(length.read_text())
    full = _run(tmp_path, GENERATE, args, write_decode=False)
    assert len(_written(short)) == 1 and not _written(full)
    assert short_length == int(length.read_text()) == 16 + 40

    kv = [run.result.over_run.category_peaks["kv_cache"] for run in (short, full)]
    assert kv[0] == kv[1], kv
    assert short.result.rows[0].peak_allocated == full.result.rows[0].peak_allocated


@pytest.mark.parametrize("shapes", ["expected", "upper"])
def test_beam_search_returns_the_runs_length_under_either_shape_rule(tmp_path, shapes):
    """Failed at 9534256 under --shapes upper: beam search crops its sequences to its finished
    beams, and a loop ended early has none (the end of sequence is never met): the sequences were
    the prompt and the steps written out, 8 tokens short of the run's."""
    _run(tmp_path, GENERATE, (2, 16, 40, "beam"), shapes=shapes)
    assert int((tmp_path / "decode.py.length").read_text()) == 16 + 40


BEAMS_GPT2 = textwrap.dedent("""
    import sys, torch
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000)).to("cuda").eval()
    ids = torch.randint(0, 1000, (1, 8), device="cuda")
    out = model.generate(ids, num_beams=4, max_new_tokens=20, do_sample=False, pad_token_id=0, eos_token_id=5)
    open(sys.argv[0] + ".length", "w").write(str(out.shape[-1]))
""")


def test_beam_search_with_every_step_run_returns_the_runs_length(tmp_path):
    """With every step run (--run-every-decode-step, or a loop that cannot be written out: Whisper's
    fp16 pipeline) the length beam search crops to is a value no prediction computes: at 5d2e06d
    the prompt alone came back (8 of 28 tokens), and Whisper's post-processing failed on it, read
    as the script's failure."""
    _run(tmp_path, BEAMS_GPT2, (), write_decode=False)
    assert int((tmp_path / "decode.py.length").read_text()) == 8 + 20


def test_a_loop_whose_scratch_is_not_affine_runs_every_step(tmp_path):
    """On an A100 SDPA runs flash attention, whose split-KV buffers follow the number of 256-token blocks of
    keys (the split count is 1, then more as the context grows): steps alike now differ later, so the loop is
    not written out, and a note says why."""
    args = (2, 16, 24, "dynamic")   # (a loop with fewer steps left than it ran runs them anyway)
    short = _run(tmp_path, GENERATE, args, gpu="A100-80GB")
    full = _run(tmp_path, GENERATE, args, write_decode=False, gpu="A100-80GB")
    told = _written(short)
    assert len(told) == 1 and "not written out" in told[0]["what"] and "flash" in told[0]["what"]
    assert _normalised(short.recorded.ops) == _normalised(full.recorded.ops)


def _kv_bytes(batch, tokens):
    return 2 * LAYERS * batch * KV_HEADS * tokens * HEAD_DIM * BF16


def _round(n):
    return -(-n // 512) * 512


def test_generate_program_against_first_principles(tmp_path):
    """4,000 new tokens after a 64-token prompt, batch 4, in a handful of steps run. The last forward (the
    N-1st after the prefill) grows each layer's DynamicCache to P + N - 1 tokens, keys and values, by a
    concatenation: the peak is when the last layer's values are concatenated, the old (P + N - 2 tokens)
    still live; beside them the weights, cuBLAS's workspace (Hopper: 32 MiB), the token ids and the
    attention mask (int64, P + N - 1 tokens each), and kilobytes of one token's activations."""
    batch, prompt, new = 4, 64, 4000
    run = _run(tmp_path, GENERATE, (batch, prompt, new, "dynamic"))
    assert "steps left written out" in _written(run)[0]["what"]
    layer = lambda tokens: batch * KV_HEADS * tokens * HEAD_DIM * BF16   # noqa: E731 - keys of one layer
    sizes = {size for kind, _, size, _ in run.recorded.ops if kind == 0}
    assert layer(prompt + new - 1) in sizes and layer(prompt + new) not in sizes
    expected = (_round(PARAMS * BF16) + 32 * 2**20 + _kv_bytes(batch, prompt + new - 1) + layer(prompt + new - 2)
                + 2 * _round(batch * (prompt + new - 1) * 8))
    peak = run.result.rows[0].peak_allocated
    assert expected <= peak < expected + 64 * 1024
    # the KV cache is a category of its own, at its largest in the last concatenation, and in the JSON
    kv = _kv_bytes(batch, prompt + new - 1) + layer(prompt + new - 2)
    assert run.result.over_run.category_peaks["kv_cache"] == kv
    assert run.result.to_dict()["category_peaks"]["kv_cache"] == kv


def test_the_peak_is_the_prefill_or_the_decode_end_whichever_is_larger(tmp_path):
    """Prompt 512, batch 4: the prefill's MLP (4 x 512 x 256 bf16, three of them live) and its logits
    outweigh 8 new tokens' cache; with 3,000 new tokens the decode end's cache (4 x 2 x 3,511 x 32 x 2 B a
    layer, 4 of them) is larger, and the peak moves there."""
    def peak_phase(new):
        run = _run(tmp_path, GENERATE, (4, 512, new, "dynamic"))
        p = run.result.at_peak
        return p.op, len(run.recorded.ops), p.categories.get("kv_cache", 0), run.result.rows[0].peak_allocated

    op, ops, kv, peak = peak_phase(8)
    assert op < ops / 2 and kv == _kv_bytes(4, 512)                # at the prefill: its cache is 512 tokens
    op, ops, kv, peak = peak_phase(3000)
    assert op > ops * 0.99                                          # in the last step
    layer = 4 * KV_HEADS * HEAD_DIM * BF16
    assert kv == _kv_bytes(4, 512 + 3000 - 1) + layer * (512 + 3000 - 2)


def test_a_user_decode_loop_under_inference_mode_is_written_out(tmp_path):
    args = (2, 16, 20)
    short, full = _run(tmp_path, USER_LOOP, args), _run(tmp_path, USER_LOOP, args, write_decode=False)
    assert len(_written(short)) == 1 and not _written(full)
    what = _written(short)[0]["what"]   # the note counts every step: those run and those written out
    assert int(what.split(": ")[1].split()[0]) + int(what.split(" the ")[1].split()[0]) == 20, what
    # the loop's own result holds only the steps run (x-transformers' generate returned 9 of 256 tokens): said
    assert "code after it sees it shorter than a real run would" in what, what
    assert _normalised(short.recorded.ops) == _normalised(full.recorded.ops)
    assert short.result.rows[0].peak_reserved == full.result.rows[0].peak_reserved


DENOISE_LIBRARY = textwrap.dedent("""
    import torch

    def progress(iterable):   # a progress bar's generator, as tqdm's __iter__
        for item in iterable:
            yield item

    @torch.no_grad()
    def sample(model, x, steps):   # a diffusion pipeline's denoising loop, over a tensor of timesteps
        for t in progress(torch.arange(steps - 1, -1, -1)):
            eps = model(x)
            x = x - 0.1 * eps
        return x
""")
DENOISE = textwrap.dedent("""
    import sys, torch
    import denoise_lib
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).cuda()
    out = denoise_lib.sample(model, torch.randn(64, 256, device="cuda"), int(sys.argv[1]))
    print("sampled", tuple(out.shape))
""")


def test_a_librarys_sampling_loop_over_a_tensor_is_written_out(tmp_path, monkeypatch):
    """A library's loop of model calls without gradients (diffusers' pipelines: `for t in
    self.progress_bar(self.scheduler.timesteps)`, a tqdm generator over a tensor) ends after a few
    steps like a user's range loop, its steps left written out: the same program op for op as every
    step run. Before, each of a 1000-step DDPM's steps ran (minutes)."""
    from amem_alloc import code_files

    library = tmp_path / "site"
    library.mkdir()
    (library / "denoise_lib.py").write_text(DENOISE_LIBRARY)
    monkeypatch.syspath_prepend(str(library))
    monkeypatch.setattr(code_files, "_NOT_USER", code_files._NOT_USER + (str(library),))   # a package's code
    short, full = _run(tmp_path, DENOISE, (40,)), _run(tmp_path, DENOISE, (40,), write_decode=False)
    assert len(_written(short)) == 1 and not _written(full)
    what = _written(short)[0]["what"]
    ran, left = int(what.split(": ")[1].split()[0]), int(what.split(" the ")[1].split()[0])
    assert ran < 10 and ran + left == 40 and "denoise_lib.py:11" in _written(short)[0]["where"], what
    assert _normalised(short.recorded.ops) == _normalised(full.recorded.ops)
    assert short.result.rows[0].peak_reserved == full.result.rows[0].peak_reserved


def test_growth_needs_every_step_to_grow_alike():
    steps = [[(0, 10 * k + i, 100 + 64 * k, 0) for i in range(2)] for k in range(6)]
    ops = [op for step in steps for op in step]
    spans = [(2 * k, 2 * k + 2) for k in range(6)]
    assert repeat.growth(ops, spans) == [64, 64]
    ops[-1] = (0, 51, 100 + 64 * 5 + 1, 0)   # the last step's second allocation grew by one byte more
    assert repeat.growth(ops, spans) is None


def test_the_numpy_walk_of_a_long_program_gives_the_plain_walks_figures():
    """analysis/at_peak.py walks a long program (a written-out decode loop) with numpy: the same peak, live set,
    category peaks and figures at markers as the plain walk, on a program with frees across steps."""
    from types import SimpleNamespace

    from amem_alloc.predict.analysis import at_peak

    ops, infos, key = [], {}, 0
    for step in range(300):
        for size in (1000 + 64 * step, 513, 4096 * (step % 7 + 1)):
            key += 1
            ops.append((0, key, size, 0))
            infos[key] = SimpleNamespace(category=("kv_cache", "temporary", "activation")[key % 3])
        ops.append((1, key - 1, 0, 0))   # frees one of its own
        if step > 2:
            ops.append((1, key - 8, 0, 0))   # and one of two steps back
    ops.append((1, 99999, 0, 0))   # a free of a block never seen is ignored by both
    markers = [(len(ops) // 3, "step"), (len(ops), "end"), (0, "start")]
    arrays = at_peak._Arrays(ops, infos, markers)
    walk = at_peak._Walk(infos, markers).run(ops)
    assert arrays.simple()
    assert arrays.walk() == (walk.peak_op, walk.peak, walk.peaks, walk.at_markers)
    assert arrays.live_at(walk.peak_op) == at_peak.live_at(ops, walk.peak_op)
    assert not at_peak._Arrays(ops + [(1, 5, 0, 0)], infos, markers).simple()   # freed twice: the plain walk


def _serve(batch, context):
    """What a server holds: 64 MiB of weights, then a bf16 KV cache of 2 layers x 2 x 8 KV heads x 64 per token,
    built layer by layer as a prefill does, and one layer's attention scores (batch x 8 x context x context fp32)."""
    import torch

    weights = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
    cache = [torch.empty(batch, 8, context, 64, dtype=torch.bfloat16, device="cuda") for _ in range(4)]
    scores = torch.empty(batch, 8, context, context, device="cuda")
    del scores
    return weights, cache


def test_fit_over_two_arguments_prints_the_frontier_consistent_with_single_predictions(tmp_path):
    from amem_alloc import predict as predict_mod
    from amem_alloc.predict import fit as fit_mod
    from amem_alloc.report.prediction_text import format_frontier

    values = [512, 2048, 4096, 8192]   # at 8192 one sequence's scores alone (2 GiB) do not fit
    front = fit_mod.frontier(_serve, "batch", "context", values, capacity_gb=2.0, policies="torch,torch-expandable")
    text = format_frontier(front)
    print(text)
    assert "--context" in text and "torch-expandable" in text and len(text.splitlines()) == 2 + len(values)
    assert "does not fit even at the smallest value" in text.splitlines()[-1]
    for policy in ("torch", "torch-expandable"):
        largest = front.largest(policy)
        assert None not in largest[:3] and largest[:3] == sorted(largest[:3], reverse=True) and largest[3] is None
        for context, batch in zip(values[:3], largest):   # at the edge: the largest fits, one more does not
            at = predict_mod.predict(_serve, batch, context, capacity_gb=2.0, policies=policy)
            over = predict_mod.predict(_serve, batch + 1, context, capacity_gb=2.0, policies=policy)
            assert at.row(policy).fits and not over.row(policy).fits
    assert front.to_dict()["frontier"][0]["fit"]["arg"] == "batch"
    from amem_alloc.report.frontier import write

    page = write(tmp_path / "frontier.html", front.to_dict()).read_text()
    assert page.count("<polyline") == 2 and "<svg" in page and ">198<" in page and "<script" not in page


def test_a_static_cache_generate_is_predicted_as_compiled_as_transformers_compiles_it(tmp_path):
    """generate() with a static cache compiles the model's call itself (transformers' compile
    config, mode="reduce-overhead") and passes the StaticCache in and gets it back in the output:
    the decode step is predicted as compiled (it ran as eager: "its result holds objects the
    trace made"), and the cache is what a static cache holds: per layer keys and values of the
    whole length, B x KV heads x (prompt + new tokens - 1: the last token is never fed back)
    x head_dim in bf16."""
    b, p, n = 2, 16, 20
    run = _run(tmp_path, GENERATE, (b, p, n, "static"))
    regions = run.recorded.compiled_regions
    assert regions and all(r["status"].startswith("predicted as compiled (inductor)") for r in regions), regions
    assert any('under CUDA graph trees' in r["status"] for r in regions), regions   # what reduce-overhead sets
    kv = b * KV_HEADS * (p + n - 1) * HEAD_DIM * BF16
    made = [size for kind, key, size, _ in run.recorded.ops if kind == replay.ALLOC and size == kv]
    assert len(made) == 2 * LAYERS, (kv, len(made))


TRAINING_WITHOUT_GRAD_AT_TIMES = textwrap.dedent("""
    import sys, torch
    from torch.utils.checkpoint import checkpoint
    kind, steps = sys.argv[1], int(sys.argv[2])
    layers = [torch.nn.Linear(64, 64).cuda() for _ in range(24)]
    teacher = torch.nn.Linear(64, 64).cuda()
    opt = torch.optim.SGD([p for layer in layers for p in layer.parameters()], lr=0.1)
    x = torch.randn(8, 64, device="cuda", requires_grad=True)
    ran = 0
    for step in range(steps):
        if kind == "teacher":   # a reference model's forward without gradients (distillation, DPO)
            with torch.no_grad():
                target = teacher(x)
        h = x
        for i in range(len(layers)):   # reentrant checkpointing runs each block without gradients
            h = checkpoint(layers[i], h, use_reentrant=True) if kind == "checkpoint" else layers[i](h)
        h.sum().backward()
        opt.step()
        ran += 1
    print("steps run", ran)
""")


@pytest.mark.parametrize("kind", ["teacher", "checkpoint"])
def test_a_training_loop_whose_model_runs_without_gradients_at_times_runs_every_step(tmp_path, capfd, kind):
    """A module returning with gradients off made a loop a "decode loop": a teacher's forward under
    no_grad in a training loop, or blocks under reentrant checkpointing, and the loop's last steps
    were written out: the script's training loop ended early (torch.utils.checkpoint's layer loop lost
    its last layer; a real run's 3rd step never ran). Loops that train are never written out."""
    run = _run(tmp_path, TRAINING_WITHOUT_GRAD_AT_TIMES, (kind, 20))
    assert not _written(run)
    assert "steps run 20" in capfd.readouterr().out


def test_a_loop_with_fewer_steps_left_than_it_ran_runs_them(tmp_path):
    """A 10-step denoising loop (diffusers' DDIM) was written out after 9 steps: its last step, which
    a callback or the scheduler's end may make different, never ran, for no time saved. A loop is
    written out only where it has at least as many steps left as it ran."""
    few, many = _run(tmp_path, USER_LOOP, (2, 16, 10)), _run(tmp_path, USER_LOOP, (2, 16, 20))
    assert not _written(few) and len(_written(many)) == 1
