"""What torch.compile's partition saves for backward, worked out without amem: AOTAutograd run
directly (`aot_module`) with inductor's decompositions and its partition function (inductor's
joint-graph passes, then `min_cut_rematerialization_partition`), on torch's fake tensors of this
machine's CPU, where torch's own autograd engine runs.

A region compiled on CUDA under autocast has CUDA autocast's casts in its graph, and its attention
is the kernel the card picks. On the CPU neither happens by itself, so `CudaChoices` writes them
out for the functions a program uses, as aten/src/ATen/autocast_mode.cpp lists them for CUDA:
`linear` runs in the lower precision (its inputs cast), `layer_norm` and `cross_entropy` in fp32,
and scaled_dot_product_attention is the kernel named (on an H100, nanoGPT's bf16 attention with
dropout 0.2 and head dim 64 takes flash: cuDNN takes no dropout that is not a multiple of 1/16,
sdp_utils.cpp check_cudnn_dropout; flash is next in torch's priority order).
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

F = torch.nn.functional
aten = torch.ops.aten


class CudaChoices(TorchFunctionMode):
    """CUDA autocast's casts (dtype `low`) and the card's attention kernel, written out."""

    def __init__(self, low: torch.dtype | None, attention: str = "flash"):
        super().__init__()
        self.low, self.attention = low, attention

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.low is not None and func is F.linear:
            args = tuple(a.to(self.low) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
            kwargs = {k: v.to(self.low) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        elif self.low is not None and func in (F.layer_norm, F.cross_entropy):
            args = tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
        elif func is F.scaled_dot_product_attention and self.attention == "flash":
            return _flash(*args, **kwargs)
        return func(*args, **kwargs)


def _flash(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    assert attn_mask is None and not enable_gqa
    return aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, False, scale=scale)[0]


def saved_storages(module: torch.nn.Module, inputs, low: torch.dtype | None, attention: str = "flash") -> list[int]:
    """Bytes of each storage the forward graph saves for backward that it made itself (neither an
    input nor a view of one), as torch's partition decides for `module(*inputs)`. The module may be
    on the meta device: its parameters and buffers are passed as fake tensors like them, and the
    inputs made by calling each of `inputs` under the fake mode."""
    from torch._functorch.aot_autograd import aot_function
    from torch._inductor.compile_fx import partition_fn
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.virtualized import V
    from torch._subclasses import FakeTensorMode

    seen = {}

    def partition(joint, joint_inputs, **kwargs):
        seen["fw"], seen["bw"] = partition_fn(joint, joint_inputs, **kwargs)
        return seen["fw"], seen["bw"]

    names = [n for n, _ in module.named_parameters()] + [n for n, _ in module.named_buffers()]

    def call(*flat):
        state = dict(zip(names, flat[:len(names)]))
        return torch.func.functional_call(module, state, tuple(flat[len(names):]))

    with FakeTensorMode() as mode, V.set_fake_mode(mode):   # inductor's random passes ask it
        state = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype).requires_grad_(t.requires_grad)
                 for t in list(module.parameters()) + list(module.buffers())]
        args = [make() for make in inputs]
        compiled = aot_function(call, fw_compiler=lambda gm, _: gm, partition_fn=partition,
                                decompositions=select_decomp_table())
        with CudaChoices(low, attention):
            compiled(*state, *args)
    return _saved(seen["fw"], seen["bw"])


def _saved(fw, bw) -> list[int]:
    n_saved = sum(1 for n in bw.graph.nodes if n.op == "placeholder" and not n.name.startswith("tangents"))
    nodes = list(fw.graph.nodes)
    out = nodes[-1].args[0]
    inputs = {id(n.meta["val"].untyped_storage()) for n in nodes
              if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)}
    saved = {}
    for node in out[len(out) - n_saved:]:
        val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if isinstance(val, torch.Tensor) and id(val.untyped_storage()) not in inputs:
            saved[id(val.untyped_storage())] = val.untyped_storage().nbytes()
    return list(saved.values())


# ============================================================================ nanoGPT, compiled
def nanogpt_compiled(batch_size=64, block_size=256, n_layer=6, n_embd=384, n_head=6, vocab_size=65, dropout=0.2):
    """train.py with its default compile=True on config/train_shakespeare_char.py: the model state
    as uncompiled (program_figures.nanogpt: parameters, gradients, fused AdamW's state), and the
    activations as torch's partition of the compiled GPT decides them, to the byte: what the
    forward graph saves for backward under bf16 autocast with flash attention (`saved_storages`,
    each storage rounded as the allocator rounds it), plus what the training step holds besides at
    the end of forward: the graph's user outputs (the bf16 logits and the fp32 loss) and the batch
    X and Y (int64, made by `get_batch` on the GPU)."""
    import sys

    import program_figures as pf

    sys.path.insert(0, str(pf.NANOGPT))
    try:
        from model import GPT, GPTConfig
    finally:
        sys.path.remove(str(pf.NANOGPT))
    with torch.device("meta"):
        gpt = GPT(GPTConfig(block_size=block_size, vocab_size=vocab_size, n_layer=n_layer, n_head=n_head,
                            n_embd=n_embd, dropout=dropout, bias=False))
    tokens = lambda: torch.randint(0, vocab_size, (batch_size, block_size))   # noqa: E731
    saved = saved_storages(gpt, [tokens, tokens], torch.bfloat16)
    BT = batch_size * block_size
    held = pf.round512(BT * vocab_size * 2) + pf.round512(4) + 2 * pf.round512(BT * 8)
    fig = pf.nanogpt(batch_size, block_size, n_layer, n_embd, n_head, vocab_size, dropout=dropout)
    fig.program, fig.activation, fig.activation_tolerance = "nanogpt_compiled", sum(map(pf.round512, saved)) + held, 0.0
    fig.activation_why = ("torch's partition of the compiled GPT (bf16 autocast, flash attention), "
                          "with the logits, the loss and the batch")
    fig.notes = {"saved_for_backward": sum(saved)}
    return fig
