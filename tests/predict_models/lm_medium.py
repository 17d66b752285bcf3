"""The script that produced the five `lm_medium_*` traces in /work/shared/traces, written from its
documented facts (traces/README.md): the CS336 "basics" Transformer LM at the "medium" size, its own
softmax, cross-entropy and AdamW, and the memory-profiling procedure (warm-up, then one recorded
forward pass or training step). The same code runs under prediction (FakeCudaSession) and, with
--dump, on a real CUDA device, writing torch's memory snapshot of the recorded step.

    python tests/predict_models/lm_medium.py --ctx 128 --mode training --dump /tmp/real.pickle

einops is not needed: its einsum and rearrange calls are written as the torch ops they become
(torch.einsum with the same subscripts; reshape/permute views, reshape copies where einops copies).
"""
from __future__ import annotations

import argparse
import math
from typing import Callable

import torch
import torch.nn as nn

MEDIUM = dict(vocab_size=10_000, d_model=1024, d_ff=4096, num_layers=24, num_heads=16)
BATCH = 4


# ============================================================================ model
def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    shifted = x - torch.max(x, dim=dim, keepdim=True)[0]
    e = torch.exp(shifted)
    return e / torch.sum(e, dim=dim, keepdim=True)


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    x_max = torch.max(x, dim=dim, keepdim=True)[0]
    x = x - x_max
    return x - torch.log(torch.sum(torch.exp(x), dim=dim, keepdim=True))


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    nll = -log_softmax(logits)
    return torch.mean(torch.gather(nll, -1, targets.unsqueeze(-1)))


def _trunc_normal(rows: int, cols: int, std: float) -> torch.Tensor:
    return nn.init.trunc_normal_(torch.empty(rows, cols), std=std, a=-3 * std, b=3 * std)


class Linear(nn.Module):
    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.weight = nn.Parameter(_trunc_normal(d_out, d_in, math.sqrt(2 / (d_in + d_out))))

    def forward(self, x):
        return torch.einsum("...a,ba->...b", x, self.weight)


class Embedding(nn.Module):
    def __init__(self, vocab: int, d: int):
        super().__init__()
        self.weight = nn.Parameter(_trunc_normal(vocab, d, 1.0))

    def forward(self, ids):
        return self.weight[ids, :]


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        x = x * rms
        return (self.weight * x).to(dtype)


class Rotary(nn.Module):
    def __init__(self, context: int, dim: int, theta: float = 10_000.0):
        super().__init__()
        d = torch.arange(0, dim, 2) / dim
        freqs = torch.tensor(theta) ** -d
        t = torch.arange(context)
        f = torch.einsum("t,f->tf", t, freqs)
        self.register_buffer("_freq_cis_cache", torch.stack((torch.cos(f), torch.sin(f))), persistent=False)

    def forward(self, x):
        half = x.shape[-1] // 2
        pairs = x.reshape(*x.shape[:-1], half, 2)                 # "... (half_d xy) -> xy ... half_d"
        x1, x2 = pairs.permute(-1, *range(pairs.dim() - 1)).unbind(0)
        cos, sin = self._freq_cis_cache[:, : x.size(-2), :].unbind(0)
        x1_rot = cos * x1 - sin * x2
        x2_rot = sin * x1 + cos * x2
        return torch.concat((x1_rot, x2_rot), dim=-1)


def attention(q, k, v, mask):
    scores = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(k.shape[-1])
    scores = torch.where(mask, scores, float("-inf"))
    return torch.einsum("...qk,...kd->...qd", softmax(scores, dim=-1), v)


class SelfAttention(nn.Module):
    def __init__(self, d_model: int, heads: int, rope: Rotary):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj = Linear(d_model, d_model), Linear(d_model, d_model)
        self.v_proj, self.output_proj = Linear(d_model, d_model), Linear(d_model, d_model)
        self.positional_encoder = rope

    def _split(self, x):   # "... seq (heads d) -> ... heads seq d": a view
        *lead, seq, d = x.shape
        return x.reshape(*lead, seq, self.heads, d // self.heads).transpose(-3, -2)

    def forward(self, x):
        b, seq, d = x.shape
        q, k, v = (self._split(p(x)) for p in (self.q_proj, self.k_proj, self.v_proj))
        q = self.positional_encoder(q)   # one at a time: q_proj's output dies as q is rebound
        k = self.positional_encoder(k)
        iota = torch.arange(seq, device=x.device)
        mask = (iota.reshape(seq, 1) >= iota.reshape(1, seq))[None, None]
        out = attention(q, k, v, mask)
        out = out.transpose(1, 2).reshape(b, seq, d).contiguous()   # einops copies here
        return self.output_proj(out)


def silu(x):
    return x * torch.sigmoid(x)


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w1, self.w2, self.w3 = Linear(d_model, d_ff), Linear(d_ff, d_model), Linear(d_model, d_ff)

    def forward(self, x):
        return self.w2(silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, d_ff: int, rope: Rotary):
        super().__init__()
        self.attn, self.ffn = SelfAttention(d_model, heads, rope), SwiGLU(d_model, d_ff)
        self.ln1, self.ln2 = RMSNorm(d_model), RMSNorm(d_model)

    def forward(self, x):   # every local lives until the block returns, as in the original
        x_attn = self.attn(self.ln1(x))
        attn_out = x + x_attn
        x_ffn = self.ffn(self.ln2(attn_out))
        return attn_out + x_ffn


class TransformerLM(nn.Module):
    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff):
        super().__init__()
        self.config = dict(vocab_size=vocab_size, context_length=context_length)
        self.token_embeddings = Embedding(vocab_size, d_model)
        self.positional_encoder = Rotary(context_length, d_model // num_heads)
        self.layers = nn.ModuleList(Block(d_model, num_heads, d_ff, self.positional_encoder)
                                    for _ in range(num_layers))
        self.ln_final = RMSNorm(d_model)
        self.lm_head = Linear(d_model, vocab_size)

    def forward(self, ids):
        embedded = self.token_embeddings(ids)   # kept alive through the forward, as in the original
        x = embedded
        for layer in self.layers:
            x = layer(x)
        x = self.ln_final(x)
        return self.lm_head(x)


class AdamW(torch.optim.Optimizer):
    """The assignment's AdamW: out-of-place updates, state m and v made on the first step (its
    `state.get(key, torch.zeros_like(grad))` makes the zeros every step)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def step(self, closure=None):
        for group in self.param_groups:
            lr, (b1, b2), eps = group["lr"], group["betas"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, state = p.grad.data, self.state[p]
                t = state.get("t", 1)
                m = state.get("m", torch.zeros_like(grad))
                v = state.get("v", torch.zeros_like(grad))
                m = b1 * m + ((1 - b1) * grad)
                v = b2 * v + ((1 - b2) * torch.square(grad))
                step = lr * (math.sqrt(1 - b2 ** t) / (1 - b1 ** t))
                p.data -= step * m / (torch.sqrt(v) + eps)
                p.data -= lr * group["weight_decay"] * p.data
                state["m"], state["v"], state["t"] = m, v, t + 1


# ============================================================================ the profiled script
def run(ctx: int, mode: str, device: str = "cuda", warmup: int = 5, autocast: bool = False,
        record: Callable[[], None] = lambda: None, synchronize: Callable[[], None] = lambda: None) -> None:
    """nsys_profile.memory_profile for "medium" at context `ctx`: `record()` is called where the
    script starts torch's memory history (after reset_peak_memory_stats). `autocast`: the
    script's --autocast (bfloat16 autocast around each forward pass and loss)."""
    amp = lambda: torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=autocast)
    model = TransformerLM(context_length=ctx, **MEDIUM)
    model.to(device)
    optimizer = AdamW(model.parameters())
    vocab = MEDIUM["vocab_size"]
    warm_in = torch.randint(0, vocab, (warmup, BATCH, ctx), dtype=torch.long, device=device)
    exec_in = torch.randint(0, vocab, (1, BATCH, ctx), dtype=torch.long, device=device)
    if mode == "inference":
        model.eval()
        with torch.inference_mode():
            for i in range(warmup):
                with amp():
                    model(warm_in[i])
            synchronize()
            record()
            with amp():
                model(exec_in[0])
                synchronize()
        return
    warm_t = torch.randint(0, vocab, (warmup, BATCH, ctx), dtype=torch.long, device=device)
    exec_t = torch.randint(0, vocab, (1, BATCH, ctx), dtype=torch.long, device=device)
    model.train()
    for i in range(warmup):
        with amp():
            output = model(warm_in[i])
            loss = cross_entropy(output, warm_t[i])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    synchronize()
    del output, loss
    optimizer.zero_grad(set_to_none=True)
    record()
    with amp():
        output = model(exec_in[0])
        loss = cross_entropy(output, exec_t[0])
    loss.backward()
    optimizer.step()
    synchronize()


# The five traces: (context, mode) -> whether the script ran with --autocast true. The README says
# float32 throughout, but lm_medium_ctx512_inference's trace shows bfloat16 autocast: every
# projection allocates a bf16 copy of its input (4 MiB), a bf16 copy of its weight (2 MiB, freed
# at once: inference mode never caches casts) and a bf16 output (4 MiB), where a float32 run
# allocates one 8 MiB output. The other four allocate float32 outputs only.
TRACES = {(128, "inference"): False, (256, "inference"): False, (512, "inference"): True,
          (128, "training"): False, (256, "training"): False}


# The GPU that made the traces was not a Hopper: each trace holds cuBLAS workspaces of 8,519,680
# bytes (4096 KiB * 2 + 16 KiB * 8, torch's default below compute capability 9), not 32 MiB.
# Training traces hold two (the forward's thread and the autograd engine's device thread).
CAPABILITY = (8, 0)


def predict(ctx: int, mode: str, warmup: int = 5, capability=CAPABILITY, autocast: bool | None = None):
    """(FakeCudaSession after the run, index of the first op of the recorded step)."""
    from amem_alloc.predict.engine.session import FakeCudaSession
    autocast = TRACES.get((ctx, mode), False) if autocast is None else autocast
    with FakeCudaSession(capability=capability, frames=False) as session:
        run(ctx, mode, warmup=warmup, autocast=autocast, record=lambda: session.marker("record"))
    start = next(i for i, name in session.markers if name == "record")
    return session, start


def predicted_peaks(ctx: int, mode: str, warmup: int = 5, capability=CAPABILITY) -> dict:
    """Peak allocated / reserved of the recorded step under the torch policy, predicted."""
    from amem_alloc import replay
    session, start = predict(ctx, mode, warmup=warmup, capability=capability)
    run = replay.run(replay.Program(replay.pack(session.ops), prologue=start), "")
    return {"peak_allocated": run.peak_allocated, "peak_reserved": run.peak_reserved}


def measured_peaks(ctx: int, mode: str, warmup: int = 5, autocast: bool | None = None) -> dict:
    """The same figures on the real CUDA device (torch's own counters after reset_peak_memory_stats)."""
    autocast = TRACES.get((ctx, mode), False) if autocast is None else autocast
    run(ctx, mode, warmup=warmup, autocast=autocast, record=torch.cuda.reset_peak_memory_stats,
        synchronize=torch.cuda.synchronize)
    out = {"peak_allocated": torch.cuda.max_memory_allocated(), "peak_reserved": torch.cuda.max_memory_reserved()}
    torch.cuda.empty_cache()
    return out


def run_on_gpu(ctx: int, mode: str, dump: str, warmup: int = 5, autocast: bool | None = None) -> None:
    def record():
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    autocast = TRACES.get((ctx, mode), False) if autocast is None else autocast
    run(ctx, mode, warmup=warmup, autocast=autocast, record=record, synchronize=torch.cuda.synchronize)
    torch.cuda.memory._dump_snapshot(dump)
    torch.cuda.memory._record_memory_history(enabled=None)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--mode", choices=("training", "inference"), default="training")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--autocast", choices=("auto", "true", "false"), default="auto",
                    help="bfloat16 autocast (auto: as the trace of this context and mode was made)")
    ap.add_argument("--dump", required=True, help="where to write torch's memory snapshot")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        raise SystemExit(0)
    run_on_gpu(a.ctx, a.mode, a.dump, a.warmup, None if a.autocast == "auto" else a.autocast == "true")
