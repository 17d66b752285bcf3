"""First-principles memory figures for the real programs under tests/programs/, computed from
their configurations alone: no amem, no fake execution.

What each figure is, in the terms of `amem predict --json` ("at_peak": bytes live at the peak,
each storage's request rounded to 512 B as CUDA's caching allocator rounds it):

* parameter: every parameter and buffer the model puts on the GPU, one storage each (a tied
  weight is one storage). Exact.
* gradient: one fp32 .grad per trainable parameter (same shape and dtype as the parameter: the
  parameters stay fp32 under autocast). Exact, when every gradient is live.
* optimizer_state: what the optimizer keeps per parameter after its first step. Exact:
    Adam/AdamW, foreach or single-tensor: exp_avg and exp_avg_sq (like the parameter); `step` is a
      CPU scalar unless fused or capturable (torch/optim/adam.py, _init_group);
    fused=True: the same plus `step` as a float32 scalar on the GPU (one 512 B block per parameter);
    SGD with momentum: momentum_buffer (like the parameter).
* activation: the tensors the forward pass saves for backward, live at the end of the forward
  pass, plus the autocast weight casts (kept until backward uses them). An estimate, from the
  layer-by-layer rules written next to each program below; each program states its tolerance.
* workspace: cuBLAS keeps one workspace per (handle, stream); handles are per thread, so a
  training step has two (the caller's thread and the autograd engine's). 32 MiB each from compute
  capability 9.0 (aten/src/ATen/cuda/CublasHandlePool.cpp): 64 MiB on an H100.

Sizes are for an H100 (capability 9.0). `round512` is the allocator's rounding (kMinBlockSize).
"""
from __future__ import annotations

import inspect
import math
import pickle
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

MiB = 1 << 20
PROGRAMS = Path(__file__).resolve().parent / "programs"
NANOGPT = PROGRAMS / "nanogpt"
CUBLAS_WORKSPACE_H100 = 32 * MiB


def round512(nbytes: int) -> int:
    return max(512, -(-nbytes // 512) * 512) if nbytes else 0


def storages(shapes, itemsize: int = 4) -> int:
    """Bytes of one storage per shape, each rounded as the allocator rounds it."""
    return sum(round512(math.prod(s) * itemsize) for s in shapes)


@dataclass
class Figures:
    program: str
    parameters: int                 # number of parameter elements
    parameter_tensors: int
    parameter: int                  # bytes: parameters and buffers on the GPU, each rounded
    gradient: int                   # bytes: all .grad storages
    optimizer_state: int            # bytes: all optimizer state on the GPU after the first step
    activation: int                 # bytes: estimate of what the forward pass saves (end of forward)
    activation_tolerance: float     # relative
    activation_why: str
    workspace: int = 2 * CUBLAS_WORKSPACE_H100
    activation_also: dict = field(default_factory=dict)   # why -> bytes: another outcome torch leaves open
    notes: dict = field(default_factory=dict)   # anything else worth printing

    def exact(self) -> dict:
        return {"parameter": self.parameter, "gradient": self.gradient, "optimizer_state": self.optimizer_state}


def adam_state(param_shapes, fused: bool) -> int:
    """exp_avg and exp_avg_sq per parameter; with `fused` (fused=True, or capturable=True as a
    compiled step sets it) also the `step` count on the GPU, a float32 scalar per parameter."""
    state = 2 * storages(param_shapes)
    return state + (round512(4) * len(param_shapes) if fused else 0)


# ============================================================================ nanoGPT
def nanogpt_param_shapes(n_layer, n_embd, vocab_size, block_size, bias=False):
    """model.py's GPT: wte (tied with lm_head: one storage), wpe, per block ln_1, c_attn, c_proj,
    ln_2, c_fc, mlp.c_proj; ln_f. LayerNorm has a weight, and a bias only with bias=True."""
    C = n_embd
    shapes = [(vocab_size, C), (block_size, C)]
    for _ in range(n_layer):
        shapes += [(C,), (3 * C, C), (C, C), (C,), (4 * C, C), (C, 4 * C)]
        if bias:
            shapes += [(C,), (3 * C,), (C,), (C,), (4 * C,), (C,)]
    shapes.append((C,))
    if bias:
        shapes.append((C,))
    return shapes


def nanogpt(batch_size=64, block_size=256, n_layer=6, n_embd=384, n_head=6, vocab_size=65, bias=False,
            dropout=0.2) -> Figures:
    """config/train_shakespeare_char.py on train.py's defaults: bias=False, dtype bfloat16 (the card
    supports it), fused AdamW (configure_optimizers: fused when on CUDA), GradScaler disabled.

    Activations, bf16 autocast, per token (B*T tokens), per block:
      ln_1: mean and rstd, fp32                                     8 B
      c_attn: its input cast to bf16 (saved by mm)                 2C
      c_attn's bf16 output: q, k, v are views of it; flash
        attention saves them                                        6C
      flash attention: its bf16 output (already in (B,T,H,hs)
        layout, so transpose(1,2).contiguous() copies nothing)
        and logsumexp (fp32, per head)                             2C + 4H
      resid_dropout: the bool mask (its output dies in the add)     C
      x + attn(...): the fp32 residual (saved by ln_2)             4C
      ln_2: mean and rstd                                           8 B
      c_fc: input cast to bf16                                     2C
      c_fc output (saved by gelu), gelu output (saved by c_proj)   8C + 8C
      mlp dropout mask                                              C
      x + mlp(...): the fp32 residual (saved by the next ln_1)     4C
    = 38C + 4H + 16 bytes per token per block (Korthikanti et al.'s 34 sbh for 16-bit residuals;
    here the residual stream is fp32). Before the blocks: the embedding dropout's fp32 output and
    bool mask (5C). After: ln_f's stats, lm_head's bf16 input (2C), the bf16 logits (2V) and
    cross_entropy's fp32 log_softmax (4V). Plus every weight's bf16 autocast copy (kept by the
    backward of each matmul) and, while GPT.forward runs, its locals: tok_emb and ln_f's fp32
    output (4C each: not saved, category "temporary").
    Tolerance 10%: rounding of the small stats tensors, philox state, the index tensors.
    """
    C, L, H, V, BT = n_embd, n_layer, n_head, vocab_size, batch_size * block_size
    shapes = nanogpt_param_shapes(n_layer, n_embd, vocab_size, block_size, bias)
    per_block = (38 * C + 4 * H + 16) * BT
    outside = (5 * C + 8 + 2 * C + 4 * V) * BT
    casts = L * (storages([(3 * C, C), (C, C), (4 * C, C), (C, 4 * C)], 2)) + storages([(V, C)], 2)
    return Figures("nanogpt", sum(math.prod(s) for s in shapes), len(shapes), storages(shapes), storages(shapes),
                   adam_state(shapes, fused=True), L * per_block + outside + casts, 0.10,
                   "saved for backward at the end of forward, bf16 autocast, flash attention",
                   notes={"temporaries_in_forward": (8 * C + 2 * V) * BT})


# ============================================================================ GPT-2 (Hugging Face)
def gpt2_param_shapes(n_layer, n_embd, vocab_size, n_positions):
    """GPT2LMHeadModel: wte (tied with lm_head), wpe; per block ln_1 (w, b), c_attn Conv1D (C, 3C)
    + bias, c_proj (C, C) + bias, ln_2, c_fc (C, 4C) + bias, mlp c_proj (4C, C) + bias; ln_f."""
    C = n_embd
    shapes = [(vocab_size, C), (n_positions, C)]
    for _ in range(n_layer):
        shapes += [(C,), (C,), (C, 3 * C), (3 * C,), (C, C), (C,), (C,), (C,), (C, 4 * C), (4 * C,), (4 * C, C), (C,)]
    return shapes + [(C,), (C,)]


def hf_trainer(layers=2, embd=128, heads=4, vocab=1000, seq=128, batch=4, bf16=True) -> Figures:
    """Trainer's defaults on torch >= 2.8: optim "adamw_torch_fused" (fused AdamW), max_grad_norm 1.0.

    Activations per token per block, bf16 autocast (Conv1D is addmm: its input is cast to bf16),
    attention by SDPA (no mask: causal; dropout 0.1: flash), dropout 0.1 everywhere:
      ln_1 stats 8 B; c_attn's bf16 input 2C; c_attn's bf16 output (q, k, v are views of it,
      saved by flash) 6C; flash output 2C (already (B,T,H,hs) in memory: transpose + contiguous
      copy nothing) and logsumexp 4H; c_proj (bf16 input: no cast); resid dropout mask C; fp32
      residual 4C; ln_2 stats 8 B; c_fc's bf16 input 2C;
      gelu_new, Python code 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*pow(x,3)))) on c_fc's bf16
      output x (4C elements): pow is on autocast's fp32 list, so x is cast to fp32 and saved
      (16C); the sum becomes fp32; tanh saves its fp32 output (16C); 1+tanh is saved by the last
      multiply (16C) with 0.5*x (bf16, 8C); the product is fp32 and c_proj casts it to bf16,
      saved (8C). c_fc's own bf16 output is saved by nothing.
      mlp dropout mask C; fp32 residual 4C.
    = 2+6+2+1+4+2+64+1+4 = 86C + 4H + 16 bytes. Outside the blocks: embedding dropout (fp32
    output and mask, 5C), ln_f's stats, lm_head's bf16 input (2C) and the loss's fp32
    log_softmax (4V; transformers' ForCausalLMLoss upcasts the logits first: not saved).
    Tolerance 15%: small tensors (stats, philox state, labels) are counted coarsely.
    """
    C, L, H, V, BT = embd, layers, heads, vocab, batch * seq
    shapes = gpt2_param_shapes(layers, embd, vocab, seq)
    per_block = (86 * C + 4 * H + 16) * BT
    outside = (5 * C + 8 + 2 * C + 4 * V) * BT
    casts = L * storages([(C, 3 * C), (3 * C,), (C, C), (C,), (C, 4 * C), (4 * C,), (4 * C, C), (C,)], 2) \
        + storages([(V, C)], 2)
    return Figures("hf_trainer", sum(math.prod(s) for s in shapes), len(shapes), storages(shapes), storages(shapes),
                   adam_state(shapes, fused=True), L * per_block + outside + casts, 0.15,
                   "saved for backward at the end of forward, bf16 autocast, SDPA flash")


# ============================================================================ Llama with GQA
def llama_param_shapes(hidden, intermediate, layers, heads, kv_heads, vocab):
    """LlamaForCausalLM (tie_word_embeddings False): embed_tokens, per layer q/k/v/o (no bias),
    gate/up/down, two RMSNorm weights; the final norm; lm_head."""
    Hd, I, kv = hidden, intermediate, hidden // heads * kv_heads
    shapes = [(vocab, Hd)]
    for _ in range(layers):
        shapes += [(Hd, Hd), (kv, Hd), (kv, Hd), (Hd, Hd), (I, Hd), (I, Hd), (Hd, I), (Hd,), (Hd,)]
    return shapes + [(Hd,), (vocab, Hd)]


def hf_llama_gqa(hidden=1024, intermediate=2816, layers=2, vocab=8192, seq=512, batch=2, heads=16,
                 kv_heads=4) -> Figures:
    """AdamW on CUDA parameters defaults to foreach: no GPU step tensors. Buffers: the rotary
    embedding's inv_freq and original_inv_freq (fp32, head_dim/2 each).

    Activations per token per layer, bf16 autocast, fp32 residual stream (the embedding is fp32
    and nothing in the residual path is autocast), SDPA with enable_gqa (no mask, head_dim 64:
    transformers passes enable_gqa=True; flash and cuDNN attention both take GQA on sm90 and save
    q, k, v, the output and a per-head fp32 logsumexp):
      input RMSNorm: x * rsqrt(var) saved in fp32 (by the weight multiply) 4H, rsqrt 4 B
      q_proj, k_proj, v_proj each cast the fp32 normed input to bf16 separately (autocast
        caches only weight casts): 3 x 2H
      rotary: q*cos + rotate_half(q)*sin promotes to fp32 (cos/sin are fp32); SDPA casts it back:
        q in bf16 2H, k in bf16 2Hkv, v (v_proj's output) 2Hkv, saved by SDPA
      SDPA output bf16 2H (o_proj's input, no cast), logsumexp 4*heads
      fp32 residual after attention 4H
      post-attention RMSNorm 4H + 4 B
      gate_proj and up_proj inputs cast separately: 2 x 2H
      gate out, silu out, up out, their product: 4 x 2I
      fp32 residual after the MLP 4H
    Outside the layers: the fp32 embedding output 4H, cos and sin (fp32, head_dim each), the final
    RMSNorm 4H, lm_head's bf16 input 2H, and the loss's log_softmax in fp32 4V (transformers'
    ForCausalLMLoss upcasts the logits; log_softmax saves its output). Plus the bf16 weight casts of
    every Linear (lm_head included; the embedding is not cast).
    Tolerance 10%.
    """
    Hd, I, L, V, BT = hidden, intermediate, layers, vocab, batch * seq
    hd = hidden // heads
    kv = hd * kv_heads
    shapes = llama_param_shapes(hidden, intermediate, layers, heads, kv_heads, vocab)
    buffers = [(hd // 2,), (hd // 2,)]
    per_layer = (4 * Hd + 4 + 6 * Hd + 2 * Hd + 4 * kv + 2 * Hd + 4 * heads + 4 * Hd + 4 * Hd + 4
                 + 4 * Hd + 8 * I + 4 * Hd) * BT
    outside = (4 * Hd + 8 * hd + 4 * Hd + 4 + 2 * Hd + 4 * V) * BT
    casts = L * storages([(Hd, Hd), (kv, Hd), (kv, Hd), (Hd, Hd), (I, Hd), (I, Hd), (Hd, I)], 2) \
        + storages([(V, Hd)], 2)
    return Figures("hf_llama_gqa", sum(math.prod(s) for s in shapes), len(shapes),
                   storages(shapes) + storages(buffers), storages(shapes), adam_state(shapes, fused=False),
                   L * per_layer + outside + casts, 0.10,
                   "saved for backward at the end of forward, bf16 autocast, SDPA flash/cuDNN with GQA")


# ============================================================================ ResNet-50
RESNET50_LAYERS = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))   # (width, blocks, stride)


def resnet50_param_shapes(classes):
    """torchvision resnet50 (Bottleneck, expansion 4, stride on the 3x3 conv): conv weights have
    no bias; every BatchNorm has weight and bias (parameters) and running_mean, running_var (fp32)
    and num_batches_tracked (int64) as buffers."""
    params, bns = [(64, 3, 7, 7)], [64]
    inplanes = 64
    for width, blocks, _ in RESNET50_LAYERS:
        for b in range(blocks):
            params += [(width, inplanes, 1, 1), (width, width, 3, 3), (width * 4, width, 1, 1)]
            bns += [width, width, width * 4]
            if b == 0:
                params.append((width * 4, inplanes, 1, 1))
                bns.append(width * 4)
            inplanes = width * 4
    params += [(c,) for c in bns for _ in range(2)]
    params += [(classes, 2048), (classes,)]
    return params, bns


def resnet50_amp(image=224, batch=8, classes=10) -> Figures:
    """SGD(momentum=0.9): one momentum buffer per parameter, made at the first step.

    Activations, fp16 autocast: convolutions run in fp16; batch_norm is on no autocast list, so it
    runs on the fp16 conv output (cuDNN takes fp16 input with fp32 weights) and returns fp16; ReLU
    is in place. Saved, per conv -> bn -> relu: the conv's output (bn's input) and bn's output
    (relu's output, the next conv's input), both fp16, plus bn's fp32 mean and invstd per
    channel. In a Bottleneck: conv1/bn1, conv2/bn2 (stride), conv3/bn3 (bn3's output takes the
    residual add and the relu in place: it is the block's output); the downsample's conv output
    (its bn output only feeds the add). Stem: the input's fp16 cast, conv1's output, bn1's output,
    maxpool's output and its int64 indices. Head: the avgpool output (fp16) feeds fc; log_softmax
    fp32. Plus the fp16 casts of every conv and fc weight (the autocast cache, then kept by each
    conv's backward), and the fp32 input batch itself (the loop's x).
    Not counted: cuDNN's batch-norm reserve space and convolution workspaces (library scratch).
    Tolerance 10%.
    """
    N = batch
    params, bns = resnet50_param_shapes(classes)
    buffers = [(c,) for c in bns for _ in range(2)]
    counters = len(bns)                              # num_batches_tracked, int64: one 512 B block each
    s = image // 2                                   # after conv1 (stride 2)
    saved = N * 3 * image * image * 2                # the input's fp16 cast (conv1's input)
    saved += 2 * N * 64 * s * s * 2                  # conv1 out, bn1 out
    s = (s + 1) // 2                                 # maxpool 3x3 stride 2, padding 1
    saved += N * 64 * s * s * (2 + 8)                # maxpool output (fp16) and indices (int64)
    bn_stats = 0
    for width, blocks, stride in RESNET50_LAYERS:
        for b in range(blocks):
            st = stride if b == 0 else 1
            so = s // st
            saved += 2 * N * width * s * s * 2 + 2 * N * width * so * so * 2 + 2 * N * 4 * width * so * so * 2
            if b == 0:
                saved += N * 4 * width * so * so * 2    # downsample conv's output
            s = so
    bn_stats = sum(2 * round512(c * 4) for c in bns)
    head = round512(N * 2048 * 2) + round512(N * classes * 2) + round512(N * classes * 4)
    conv_fc_weights = [p for p in params if len(p) == 4] + [(classes, 2048), (classes,)]
    casts = storages(conv_fc_weights, 2)
    x = round512(N * 3 * image * image * 4) + round512(N * 8)
    return Figures("resnet50_amp", sum(math.prod(p) for p in params), len(params),
                   storages(params) + storages(buffers) + counters * round512(8), storages(params),
                   storages(params), saved + bn_stats + head + casts + x, 0.10,
                   "saved for backward at the end of forward, fp16 autocast (cuDNN conv/bn)",
                   workspace=2 * CUBLAS_WORKSPACE_H100)


# ============================================================================ small MLP programs
def mlp_shapes(sizes):
    shapes = []
    for a, b in zip(sizes, sizes[1:]):
        shapes += [(b, a), (b,)]
    return shapes


def dataloader_workers(features=512, hidden=1024, classes=10, batch=64) -> Figures:
    """Adam (foreach on CUDA). Activations saved by forward (fp32): each Linear's input (x is the
    batch, the others are ReLU outputs, which ReLU saves too), the logits' log_softmax; the batch
    x and labels y themselves."""
    shapes = mlp_shapes([features, hidden, hidden, classes])
    act = (round512(batch * features * 4) + 2 * round512(batch * hidden * 4) + round512(batch * classes * 4)
           + round512(batch * 8))
    return Figures("dataloader_workers", sum(math.prod(s) for s in shapes), len(shapes), storages(shapes),
                   storages(shapes), adam_state(shapes, fused=False), act, 0.10,
                   "saved for backward at the end of forward, fp32")


def partition_saved(fn, *shapes) -> list[int]:
    """Storage sizes the forward saves for backward that it made itself, as torch.compile's
    partition decides (AOTAutograd with inductor's decompositions and partition function, run
    directly on CPU fake tensors, whose graph is CUDA's for fp32 code)."""
    import torch
    from torch._functorch.aot_autograd import aot_function
    from torch._inductor.compile_fx import partition_fn
    from torch._inductor.decomposition import select_decomp_table
    from torch._subclasses import FakeTensorMode

    seen = {}

    def partition(joint, joint_inputs, **kwargs):
        seen["fw"], seen["bw"] = partition_fn(joint, joint_inputs, **kwargs)
        return seen["fw"], seen["bw"]

    with FakeTensorMode():
        args = [torch.empty(shape).requires_grad_() for shape in shapes]
        aot_function(fn, fw_compiler=lambda gm, _: gm, partition_fn=partition,
                     decompositions=select_decomp_table())(*args)
    n_saved = sum(1 for n in seen["bw"].graph.nodes if n.op == "placeholder" and not n.name.startswith("tangents"))
    nodes = list(seen["fw"].graph.nodes)
    out = nodes[-1].args[0]
    inputs = {id(n.meta["val"].untyped_storage()) for n in nodes if n.op == "placeholder"}
    saved = {id(st): st.nbytes() for st in (n.meta["val"].untyped_storage() for n in out[len(out) - n_saved:])
             if id(st) not in inputs}
    return list(saved.values())


def compiled_step(width=1024, depth=4, batch=64) -> Figures:
    """The model predicted as compiled, the optimizer step (a compiled function) as inductor's
    compiled step takes memory: in place, as torch's fused Adam (no foreach temporaries). dynamo
    sets capturable on the compiled step (torch/_dynamo/variables/optimizer.py `_set_capturable`),
    so `step` lives on the GPU: one 512 B block per parameter, as fused Adam's.
    Activations: what torch's partition saves for the model's backward (`partition_saved`: per
    layer the Linear's output with LayerNorm's mean and rstd; LayerNorm and GELU are recomputed),
    with the input x and mse_loss's inputs (the model's output and y), fp32."""
    import torch

    shapes = []
    for _ in range(depth):
        shapes += [(width, width), (width,), (width,), (width,)]
    shapes += [(1, width), (1,)]

    def model(x, *params):
        for i in range(depth):
            w, b, g, beta = params[4 * i: 4 * i + 4]
            x = torch.nn.functional.gelu(torch.nn.functional.layer_norm(
                torch.nn.functional.linear(x, w, b), (width,), g, beta))
        return torch.nn.functional.linear(x, params[-2], params[-1])

    saved = partition_saved(model, (batch, width), *shapes)
    act = round512(batch * width * 4) + sum(round512(n) for n in saved) + 2 * round512(batch * 4)
    return Figures("compiled_step", sum(math.prod(s) for s in shapes), len(shapes), storages(shapes),
                   storages(shapes), adam_state(shapes, fused=True), act, 0.10,   # capturable
                   "saved for backward at the end of forward: torch's partition of the compiled model")


def encoder_param_shapes(vocab, d, layers, classes):
    """Embedding; per nn.TransformerEncoderLayer: self_attn in_proj (3d, d) + bias, out_proj (d, d)
    + bias, linear1 (4d, d) + bias, linear2 (d, 4d) + bias, norm1 and norm2 (weight, bias); head."""
    shapes = [(vocab, d)]
    for _ in range(layers):
        shapes += [(3 * d, d), (3 * d,), (d, d), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,), (d,), (d,), (d,), (d,)]
    return shapes + [(classes, d), (classes,)]


def fused_adamw(impl="fused", vocab=4096, d_model=256, heads=4, layers=2, seq=128, batch=16) -> Figures:
    """AdamW fused or foreach; clip_grad_norm_ (foreach norms).

    Activations per token per layer, fp32, norm_first, dropout 0.1, multi_head_attention_forward
    in training (no fast path; SDPA in fp32 with dropout: the memory-efficient kernel, flash takes
    no fp32):
      norm1's stats 8 B (its output is not saved: batch_first transposes it, and the in_proj linear
        saves the contiguous copy F.linear makes of the transposed input) 4d
      in_proj's output, copied to (3, T, B, d) contiguous by _in_projection_packed (q, k, v are views
        of the copy, saved by SDPA; the linear's own output is not saved) 12d
      SDPA's output 4d and logsumexp (fp32, per head) 4*heads
      the output's permute(2, 0, 1, 3).reshape() copy (out_proj's input) 4d
      dropout1's mask d; the residual x + sa (norm2's input) 4d; norm2's output (linear1's input) 4d
      linear1's output is not saved (relu saves its output): relu's output 16d; dropout's mask 4d
      and output (linear2's input) 16d; dropout2's mask d; the residual 4d
    = 4+12+4+4+1+4+4+16+4+16+1+4 = 74d + 4*heads + 16 bytes. Outside: the embedding output 4d
    (the first layer's input), the token ids, the mean over the sequence (the head's input), the
    loss's log_softmax. Tolerance 10%.
    """
    d, BT = d_model, batch * seq
    shapes = encoder_param_shapes(vocab, d, layers, 2)
    per_layer = (74 * d + 4 * heads + 16) * BT
    outside = 4 * d * BT + round512(BT * 8) + round512(batch * d * 4) + 2 * round512(batch * 2 * 4)
    return Figures(f"fused_adamw[{impl}]", sum(math.prod(s) for s in shapes), len(shapes), storages(shapes),
                   storages(shapes), adam_state(shapes, fused=(impl == "fused")), layers * per_layer + outside,
                   0.10, "saved for backward at the end of forward, fp32, SDPA memory-efficient")


# ============================================================================ mixture of experts
def training_peak(fig: Figures) -> int:
    """A training loop's peak allocated (AdamW foreach, zero_grad to None), from its figures: the
    larger of the start of backward — parameters, optimizer state, cuBLAS's workspaces, every
    activation, and the loss's two fp32 (T, V) gradients alive at once in log_softmax's backward
    (nll_loss's gradient in, log_softmax's out: `loss_gradients`) — and the optimizer step —
    parameters, gradients, state, workspaces and foreach AdamW's one parameter-sized temporary (the
    square root of exp_avg_sq, torch/optim/adam.py _multi_tensor_adam)."""
    backward = fig.parameter + fig.optimizer_state + fig.workspace + fig.activation + fig.notes["loss_gradients"]
    step = fig.parameter + 2 * fig.gradient + fig.optimizer_state + fig.workspace
    return max(backward, step)


def routed_rows(tokens, top_k) -> int:
    """The rows a top-k router sends to all experts of a layer together: every token to k experts
    (distinct), whatever the routing."""
    return tokens * top_k


def mixtral_param_shapes(hidden, intermediate, layers, heads, kv_heads, experts, vocab):
    """MixtralForCausalLM (tie_word_embeddings False): embed_tokens; per layer q/k/v/o (no bias), the
    router's weight (experts, hidden), the experts' fused gate_up_proj (experts, 2I, hidden) and
    down_proj (experts, hidden, I) (MixtralExperts keeps 3-D parameters), two RMSNorm weights; the
    final norm; lm_head."""
    Hd, kv = hidden, hidden // heads * kv_heads
    shapes = [(vocab, Hd)]
    for _ in range(layers):
        shapes += [(Hd, Hd), (kv, Hd), (kv, Hd), (Hd, Hd), (experts, Hd), (experts, 2 * intermediate, Hd),
                   (experts, Hd, intermediate), (Hd,), (Hd,)]
    return shapes + [(Hd,), (vocab, Hd)]


def hf_mixtral_moe(hidden=512, intermediate=1024, layers=2, experts="grouped_mm", num_experts=8, top_k=2,
                   vocab=4096, seq=512, batch=2, dtype="bfloat16") -> Figures:
    """The model in bf16 (`.to(device, bfloat16)`: parameters and the rotary buffers), no autocast;
    AdamW foreach (state in bf16 like the parameters, `step` on the CPU). 8 query and 2 key/value
    heads.

    Activations per token per layer (T = batch * seq tokens), 2 bytes an element unless said:
      each RMSNorm (Python: x.to(float32), pow, mean, rsqrt, multiply, .to(bf16), weight *):
        the fp32 copy 4H (saved by pow and the multiply), its bf16 cast 2H (saved by the weight
        multiply), the output 2H (the next linears' input), rsqrt 4 B: 8H + 4, twice per layer
      attention: q after rotary 2H (the add's output, SDPA's query); the config's default
        use_cache=True makes a DynamicCache in training too, whose update concatenates the keys and
        values (cat: copies), which SDPA saves: 2*kv + 2*kv; SDPA's output 2H (already in (B, S, H)
        order: o_proj's input is a view of it), logsumexp 4 B per head. q*cos and rotate_half(q)*sin
        save only cos and sin (no gradient flows to them)
      router: softmax's fp32 output 4E, topk's int64 indices 8k, the weights' sum 4 B and the
        in-place division's saved copy 4k: 4E + 12k + 4
      experts, per routed row, rows = T * k in all (the number every routing conserves):
        eager (a pass per expert on its rows): the gathered input 2H, gate_up's output 4I (gate and
          up are views of it: silu and the multiply save it), silu's output 2I, the product 2I
          (down's input), down's output 2H (saved by the multiply with the fp32 routing weight,
          whose gathered [n, 1] column is 4 B), the product cast back to bf16 2H (index_add_ saves
          its source: derivatives.yaml uses source's shape), torch.where's int64 (n, 2) 16 B:
          6H + 8I + 20
        grouped_mm (sorted by expert, one grouped matmul each way): the gathered input 2H, the
          first grouped_mm's output 4I, silu 2I, the product 2I, the second's output 2H, the fp32
          weight 4 B, the int64 perm // k, the sorted weights' perm and inv_perm 24 B: 4H + 8I + 28
    Outside the layers: the final norm 8H + 4; the loss upcasts the logits to fp32 and log_softmax
    saves its output 4V; input ids and labels 16 B; cos and sin (bf16, seq x head_dim each).
    Tolerance 10%.
    """
    Hd, I, L, V, E, k = hidden, intermediate, layers, vocab, num_experts, top_k
    T, heads, kv_heads = batch * seq, 8, 2
    hd = Hd // heads
    kv = hd * kv_heads
    itemsize = 2 if dtype == "bfloat16" else 4
    shapes = mixtral_param_shapes(Hd, I, L, heads, kv_heads, E, V)
    buffers = [(hd // 2,), (hd // 2,)]
    per_token = 2 * (8 * Hd + 4) + 4 * Hd + 4 * kv + 4 * heads + 4 * E + 12 * k + 4
    per_row = 6 * Hd + 8 * I + 20 if experts == "eager" else 4 * Hd + 8 * I + 28
    outside = T * (8 * Hd + 4 + 4 * V + 16) + 2 * 2 * seq * hd
    activation = L * (T * per_token + routed_rows(T, k) * per_row) + outside
    return Figures(f"hf_mixtral_moe[{experts}]", sum(math.prod(s) for s in shapes), len(shapes),
                   storages(shapes, itemsize) + storages(buffers, itemsize), storages(shapes, itemsize),
                   2 * storages(shapes, itemsize), activation, 0.10,
                   "saved for backward at the end of forward, bf16 model, T*k routed rows per layer",
                   notes={"routed_rows_per_layer": routed_rows(T, k), "expert_bytes_per_row": per_row,
                          "loss_gradients": 2 * 4 * V * T})


def deepseek_param_shapes(dim, inter, layers, experts, shared, vocab):
    """deepseek_moe.py's Model: embedding; per layer an RMSNorm weight, the gate's (experts, dim),
    each routed expert's w1 (inter, dim), w2 (dim, inter), w3 (inter, dim), the shared experts as one
    SwiGLU of shared * inter; the final norm; the head."""
    shapes = [(vocab, dim)]
    for _ in range(layers):
        shapes += [(dim,), (experts, dim)]
        shapes += [(inter, dim), (dim, inter), (inter, dim)] * experts
        shapes += [(shared * inter, dim), (dim, shared * inter), (shared * inter, dim)]
    return shapes + [(dim,), (vocab, dim)]


def deepseek_moe(dim=256, inter=512, layers=2, experts=8, topk=2, shared=2, vocab=4096, seq=256, batch=4) -> Figures:
    """fp32, no autocast; AdamW foreach.

    Activations per token per layer (T = batch * seq):
      RMSNorm (torch's fused kernel): its input, the residual stream 4H, the inverse RMS 4 B, its
        output 4H (the gate's, the shared experts' and the gathers' input)
      gate: sigmoid's output 4E, topk's indices 8k (gather saves them), the gathered scores 4k and
        their sum 4 B (the division saves both): 4E + 12k + 4
      routed experts, per routed row (T * k rows in all): x[idx] 4H (w1 and w3 save it), w1's output
        4I (silu), silu's output 4I and w3's 4I (their product saves both), the product 4I (w2),
        w2's output 4H (the multiply by the weight saves it, and the gathered [n, 1] weight 4 B),
        torch.where's int64 (n, 2) 16 B (the gathers' indices): 8H + 16I + 20 (y[idx] += ...
        saves only indices: index and index_put_)
      shared experts on every token: w1's, silu's, w3's outputs and the product, 4 x 4*shared*I
    Outside: the final norm (input 4H, inverse RMS 4 B, output 4H), the logits 4V (the loop keeps
    them) and log_softmax's output 4V, the int64 tokens and the targets' copy 16 B. Tolerance 10%.
    """
    H, I, L, V, E, k, T = dim, inter, layers, vocab, experts, topk, batch * seq
    shapes = deepseek_param_shapes(dim, inter, layers, experts, shared, vocab)
    per_token = 4 * H + 4 + 4 * H + 4 * E + 12 * k + 4 + 16 * shared * I
    per_row = 8 * H + 16 * I + 20
    outside = T * (8 * H + 4 + 8 * V + 16)
    activation = L * (T * per_token + routed_rows(T, k) * per_row) + outside
    return Figures("deepseek_moe", sum(math.prod(s) for s in shapes), len(shapes), storages(shapes),
                   storages(shapes), adam_state(shapes, fused=False), activation, 0.10,
                   "saved for backward at the end of forward, fp32, T*k routed rows per layer",
                   notes={"routed_rows_per_layer": routed_rows(T, k), "expert_bytes_per_row": per_row,
                          "loss_gradients": 2 * 4 * V * T})


# ============================================================================ the programs
@dataclass
class Program:
    """A program under tests/programs/, how it is run (its own command line only), and what its
    prediction is judged against."""
    name: str
    script: str                      # relative to its folder
    smoke: list                      # arguments of the default run (small, a few seconds)
    full: list                       # arguments of the slow run and of the benchmark
    figures: Callable                # (the arguments as a dict) -> Figures
    stand_ins: list = field(default_factory=list)      # source texts whose lines must hold a stand-in note
    not_modelled: Callable = lambda args: []          # (its arguments) -> texts whose lines hold a not-modelled note
    needs: tuple = ()                # modules it imports beyond torch
    folder: Path = PROGRAMS
    workspace_exact: bool = True     # only cuBLAS's workspaces (False: cuDNN's are estimates)
    peak_after_first_step: bool = True
    known: dict = field(default_factory=dict)   # check -> why amem fails it now (file:line, cause)

    def path(self) -> Path:
        return self.folder / self.script

    def args(self, size: str) -> list:
        return list(self.smoke if size == "smoke" else self.full)

    def expected(self, size: str) -> Figures:
        return self.figures(command_line(self.args(size)))

    def workdir(self, scratch: Path) -> Path:
        """The folder to run it in: its own, or for nanoGPT a prepared copy (nanogpt_workdir)."""
        return nanogpt_workdir(scratch) if self.folder == NANOGPT else self.folder


def _compiled_figures():
    import compiled_reference   # torch's partition, run when a compiled program's figures are asked

    return compiled_reference


def command_line(args: list) -> dict:
    """--key value / --key=value / --flag -> {key: value} (dashes as underscores), as argparse reads them."""
    out, i = {}, 0
    while i < len(args):
        a = str(args[i]).lstrip("-").replace("-", "_")
        if "=" in a:
            k, v = a.split("=", 1)
            out[k] = v
        elif i + 1 < len(args) and not str(args[i + 1]).startswith("--"):
            out[a], i = args[i + 1], i + 1
        else:
            out[a] = True
        i += 1
    return {k: (int(v) if isinstance(v, str) and v.isdigit() else v) for k, v in out.items()}


def _pick(fn, args: dict, **extra) -> Figures:
    names = inspect.signature(fn).parameters
    return fn(**{k: v for k, v in {**args, **extra}.items() if k in names})


LARGER_TRANSFORMER = ["--d-model", "512", "--layers", "6", "--seq", "512"]
PROGRAM_LIST = [
    Program("hf_trainer", "hf_trainer.py", ["--bf16"],
            ["--layers", "4", "--embd", "256", "--seq", "256", "--batch", "8", "--bf16"],
            lambda a: _pick(hf_trainer, a, bf16=bool(a.get("bf16"))),
            stand_ins=["trainer.train()"], needs=("transformers", "accelerate")),
    Program("hf_trainer_compiled", "hf_trainer.py", ["--bf16", "--torch-compile"],
            ["--layers", "4", "--embd", "256", "--seq", "256", "--batch", "8", "--bf16", "--torch-compile"],
            lambda a: _pick(_compiled_figures().hf_trainer_compiled, a, bf16=bool(a.get("bf16"))),
            stand_ins=["trainer.train()"], needs=("transformers", "accelerate")),
    Program("hf_llama_gqa", "hf_llama_gqa.py", ["--seq", "256"],
            ["--hidden", "2048", "--intermediate", "5632", "--layers", "4", "--seq", "1024", "--batch", "4"],
            lambda a: _pick(hf_llama_gqa, a), stand_ins=["loss.item()"], needs=("transformers",)),
    Program("resnet50_amp", "resnet50_amp.py", ["--image", "128", "--batch", "4"], ["--batch", "32"],
            lambda a: _pick(resnet50_amp, a), stand_ins=["scaler.step(optimizer)", "loss.item()"],
            needs=("torchvision",), workspace_exact=False),
    Program("dataloader_workers", "dataloader_workers.py", [], ["--samples", "2048", "--batch", "256"],
            lambda a: _pick(dataloader_workers, a), stand_ins=["loss.item()"]),
    Program("fused_adamw", "fused_adamw.py", ["--impl", "fused"], ["--impl", "fused", *LARGER_TRANSFORMER],
            lambda a: _pick(fused_adamw, a), stand_ins=["loss.item()"]),
    Program("foreach_adamw", "fused_adamw.py", ["--impl", "foreach"], ["--impl", "foreach", *LARGER_TRANSFORMER],
            lambda a: _pick(fused_adamw, a), stand_ins=["loss.item()"]),
    Program("compiled_step", "compiled_step.py", [], ["--width", "4096", "--depth", "8", "--batch", "256"],
            lambda a: _pick(compiled_step, a), stand_ins=["loss.item()"],
            not_modelled=lambda args: ["        optimizer_step()"]),   # the region's first call: its trace
    Program("nanogpt", "train.py",
            ["config/train_shakespeare_char.py", "--max_iters=2", "--eval_iters=2", "--compile=False"],
            ["config/train_shakespeare_char.py", "--max_iters=5", "--eval_iters=5", "--compile=False"],
            lambda a: nanogpt(), stand_ins=["losses[k] = loss.item()", "lossf = loss.item()"], folder=NANOGPT),
    Program("nanogpt_compiled", "train.py",
            ["config/train_shakespeare_char.py", "--max_iters=2", "--eval_iters=2"],
            ["config/train_shakespeare_char.py", "--max_iters=5", "--eval_iters=5"],
            lambda a: _compiled_figures().nanogpt_compiled(),
            stand_ins=["losses[k] = loss.item()", "lossf = loss.item()"], folder=NANOGPT),
    Program("hf_mixtral_moe_eager", "hf_mixtral_moe.py",
            ["--experts", "eager", "--hidden", "256", "--intermediate", "1024", "--vocab", "1024", "--seq", "512",
             "--batch", "4"],
            ["--experts", "eager", "--hidden", "512", "--intermediate", "2048", "--seq", "1024", "--batch", "4"],
            lambda a: _pick(hf_mixtral_moe, a), stand_ins=["loss.item()"], needs=("transformers",)),
    Program("hf_mixtral_moe", "hf_mixtral_moe.py",
            ["--hidden", "256", "--intermediate", "1024", "--vocab", "1024", "--seq", "512", "--batch", "4"],
            ["--hidden", "512", "--intermediate", "2048", "--seq", "1024", "--batch", "4"],
            lambda a: _pick(hf_mixtral_moe, a), stand_ins=["loss.item()"], needs=("transformers",)),
    Program("deepseek_moe", "deepseek_moe.py", ["--vocab", "1024"], ["--dim", "512", "--inter", "1024", "--seq", "1024"],
            lambda a: _pick(deepseek_moe, a), stand_ins=["loss.item()"]),
]
BY_NAME = {p.name: p for p in PROGRAM_LIST}


def nanogpt_workdir(root: Path) -> Path:
    """What a user of nanoGPT has after `python data/shakespeare_char/prepare.py`: the scripts, and
    data/shakespeare_char/{train,val}.bin (uint16 token ids) and meta.pkl, here random tokens
    (memory does not depend on their values)."""
    import numpy as np

    work = root / "nanogpt"
    work.mkdir(parents=True, exist_ok=True)
    for name in ("train.py", "model.py", "configurator.py"):
        shutil.copy(NANOGPT / name, work / name)
    shutil.copytree(NANOGPT / "config", work / "config", dirs_exist_ok=True)
    data = work / "data" / "shakespeare_char"
    data.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rng.integers(0, 65, size=50_000, dtype=np.uint16).tofile(data / "train.bin")
    rng.integers(0, 65, size=5_000, dtype=np.uint16).tofile(data / "val.bin")
    with open(data / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 65, "itos": {}, "stoi": {}}, f)
    return work
