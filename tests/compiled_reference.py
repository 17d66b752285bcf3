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

import contextlib

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
        if self.low is not None and func in (F.linear, torch.addmm):
            args = tuple(a.to(self.low) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
            kwargs = {k: v.to(self.low) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        elif self.low is not None and func in (F.layer_norm, F.cross_entropy, torch.pow):
            args = tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
        elif func is F.scaled_dot_product_attention and self.attention == "flash":
            return _flash(*args, **kwargs)
        elif func is F.scaled_dot_product_attention and self.attention == "efficient":
            return _efficient(*args, **kwargs)
        return func(*args, **kwargs)


def _flash(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    assert attn_mask is None and not enable_gqa
    return aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, False, scale=scale)[0]


def _efficient(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """attention.cpp's memory-efficient case: a boolean mask made additive in the query's dtype
    (convert_boolean_attn_mask: 0 where kept, -inf where masked), aligned already here (its
    strides are multiples of 8: preprocess_mask pads nothing) and expanded to (B, H, L, S)."""
    assert not enable_gqa
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.where(attn_mask.logical_not(), -float("inf"), torch.scalar_tensor(0.0, dtype=q.dtype))
    if attn_mask is not None:
        assert all(s % 8 == 0 for s in attn_mask.stride()[:-1]), attn_mask.stride()
        attn_mask = attn_mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    return aten._scaled_dot_product_efficient_attention(q, k, v, attn_mask, True, dropout_p, is_causal,
                                                        scale=scale)[0]


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


# ============================================================================ HF Trainer, compiled
def dynamo_saved_per_graph(call, low: torch.dtype | None, attention: str) -> list[list[int]]:
    """Each graph's storages its forward saves for backward (those it made itself, as `_saved`), in the
    order dynamo compiles them, for `call()` run by dynamo with AOTAutograd, inductor's
    decompositions and its partition function: torch.compile's own pipeline up to the partition,
    on the CPU's fake tensors `call` makes, CUDA's autocast casts and the card's attention kernel
    written out (`CudaChoices`; `attention` None: none, no autocast or attention to choose for)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.compile_fx import partition_fn
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.virtualized import V

    saved = []

    def partition(joint, joint_inputs, **kwargs):
        with V.set_fake_mode(torch._guards.detect_fake_mode(joint_inputs)):   # its random passes ask it
            fw, bw = partition_fn(joint, joint_inputs, **kwargs)
        saved.append(_saved(fw, bw))
        return fw, bw

    backend = aot_autograd(fw_compiler=lambda gm, _: gm, bw_compiler=lambda gm, _: gm, partition_fn=partition,
                           decompositions=select_decomp_table())
    torch._dynamo.reset()
    try:   # (no choices to write out: no mode on the stack, which changes which frames dynamo compiles)
        with CudaChoices(low, attention) if attention else contextlib.nullcontext():
            call(backend)
    finally:
        torch._dynamo.reset()
    return saved


def hf_trainer_compiled_saved(layers=2, embd=128, heads=4, vocab=1000, seq=128, batch=4) -> list[list[int]]:
    """tests/programs/hf_trainer.py --bf16 --torch-compile, its model's graphs as torch compiles
    them: GPT-2 as that script configures it, called as the Trainer calls it (transformers'
    trainer.py: `use_cache` from TrainingArguments, False; `model(**inputs)` with the labels and
    `num_items_in_batch`), its forward wrapped as accelerate wraps it for bf16
    (`convert_outputs_to_fp32` around CUDA autocast, whose casts CudaChoices writes out: GPT-2's
    Conv1D is `torch.addmm`, in autocast's lower-precision list; its GELU's `torch.pow` is in the
    fp32 list), then `torch.compile`d (accelerate compiles the wrapped model).

    Attention: under dynamo transformers cannot read the position ids to rule out packed
    sequences (masking_utils.find_packed_sequence_indices), so it builds a boolean mask; with a
    mask flash is out (sdp_utils.cpp check_for_attn_mask), cuDNN takes no dropout of 0.1
    (check_cudnn_dropout... as for nanoGPT), and the memory-efficient kernel runs (`_efficient`)."""
    from accelerate.utils import convert_outputs_to_fp32
    from torch._subclasses import FakeTensorMode
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=layers, n_embd=embd, n_head=heads, vocab_size=vocab, n_positions=seq,
                        bos_token_id=vocab - 1, eos_token_id=vocab - 1, use_cache=False)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        model = GPT2LMHeadModel(config)
        ids = torch.randint(0, vocab, (batch, seq))
        items = torch.tensor(batch * (seq - 1))
    model.train()
    model.forward = convert_outputs_to_fp32(model.forward)

    def call(backend):
        torch.compile(model, backend=backend)(input_ids=ids, labels=ids, num_items_in_batch=items)
    return dynamo_saved_per_graph(call, torch.bfloat16, "efficient")


def hf_trainer_compiled(layers=2, embd=128, heads=4, vocab=1000, seq=128, batch=4, bf16=True):
    """The Trainer's step with the model compiled: the model state as uncompiled
    (program_figures.hf_trainer), and the activations at their largest (as a later step's backward
    starts) as torch's partition of each graph decides them (`hf_trainer_compiled_saved`, each
    storage rounded as the allocator rounds it), plus what the step holds besides:
      the bf16 logits (graph 1's output, which the loss graph keeps for its backward);
      the batch's input ids and labels (int64, moved to the GPU by the Trainer);
      the first step's model output, its bf16 logits and the fp32 logits accelerate's
      `convert_outputs_to_fp32` made: on the first call dynamo converts each frame after a graph
      break while it runs, and the frame around that conversion holds the output in dynamo's own
      records (SideEffects' UserDefinedDictVariable of the CausalLMOutput, a reference cycle), so
      it lives until Python's next full collection. Later steps' fp32 logits die as the Trainer
      takes the loss from the output.
    When that collection comes depends on every Python object the process made (amem's own
    among them), not on torch: after the second step's backward began, the largest total is a
    later step's (the figure); before, it is the first step's own backward start, where the held
    output is that step's and the later step's bf16 logits are not yet made (`activation_also`).
    The loss, the item count and backward's first gradient (a few 512-byte blocks) are inside the
    1% tolerance."""
    import program_figures as pf

    assert bf16, "the compiled figures are for --bf16"
    saved = [n for graph in hf_trainer_compiled_saved(layers, embd, heads, vocab, seq, batch) for n in graph]
    BT = batch * seq
    logits_bf16, logits_fp32 = pf.round512(BT * vocab * 2), pf.round512(BT * vocab * 4)
    held = logits_bf16 + 2 * pf.round512(BT * 8) + (logits_bf16 + logits_fp32)
    fig = pf.hf_trainer(layers, embd, heads, vocab, seq, batch, bf16)
    fig.program, fig.activation, fig.activation_tolerance = "hf_trainer_compiled", sum(map(pf.round512, saved)) + held, 0.01
    fig.activation_why = ("torch's partition of each of the compiled GPT-2's graphs (bf16 autocast, memory-efficient "
                          "attention with transformers' mask), with the logits, the batch and the first step's output")
    fig.activation_also = {"the first step's output collected before the second step's backward":
                           fig.activation - logits_bf16}
    fig.notes = {"saved_for_backward": sum(saved)}
    return fig


# ============================================================================ torchtitan's loss, compiled
def torchtitan_loss_saved(batch: int, seq: int, vocab: int, dtype: torch.dtype) -> list[int]:
    """What torch's partition saves for backward in torchtitan's compiled loss
    (components/loss.py `cross_entropy_loss`, `--compile.enable` compiles it) on the model's output
    of (batch, seq, vocab) in `dtype` (FSDP2's param dtype, bf16 by default) and int64 labels:
    AOTAutograd run directly with inductor's decompositions and partition, on the CPU's fakes."""
    from torchtitan.components.loss import cross_entropy_loss
    from torch._functorch.aot_autograd import aot_function
    from torch._inductor.compile_fx import partition_fn
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.virtualized import V
    from torch._subclasses import FakeTensorMode

    seen = {}

    def partition(joint, joint_inputs, **kwargs):
        seen["fw"], seen["bw"] = partition_fn(joint, joint_inputs, **kwargs)
        return seen["fw"], seen["bw"]

    with FakeTensorMode() as mode, V.set_fake_mode(mode):
        pred = torch.empty(batch, seq, vocab, dtype=dtype).requires_grad_()
        labels = torch.randint(0, vocab, (batch, seq))
        compiled = aot_function(lambda p, y: cross_entropy_loss(p, y), fw_compiler=lambda gm, _: gm,
                                partition_fn=partition, decompositions=select_decomp_table())
        compiled(pred, labels)
    return _saved(seen["fw"], seen["bw"])


# ============================================================================ DDP, compiled
def _bucket_as_is(state, bucket):
    done = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def ddp_compiled_saved(width: int, layers: int, batch: int, bucket_cap_mb: float) -> list[list[int]]:
    """Each graph's saved storages for `DDP(torch.compile(Sequential of `layers` Linear(width,
    width) and GELU), bucket_cap_mb=...)`, as nanoGPT wraps its compiled model: dynamo's DDP optimizer
    splits the graph at DDP's gradient buckets (torch/_dynamo/backends/distributed.py) and each
    split graph goes through AOTAutograd with inductor's decompositions and partition. Run on
    the CPU under torch's fake process group (2 ranks; nothing is communicated)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def call(backend):
        model = torch.nn.Sequential(*[m for _ in range(layers) for m in (torch.nn.Linear(width, width), torch.nn.GELU())])
        model = DDP(torch.compile(model, backend=backend), bucket_cap_mb=bucket_cap_mb)
        model.register_comm_hook(None, _bucket_as_is)   # the fake group's all-reduce gives no tensor back
        model(torch.randn(batch, width)).sum().backward()

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        return dynamo_saved_per_graph(call, None, None)
    finally:
        dist.destroy_process_group()


# ============================================================================ torchtitan's compiled blocks
def torchtitan_block_saved(flavor: str, batch: int, seq: int) -> list[list[int]]:
    """What torch's partition saves for backward in one of torchtitan's compiled TransformerBlocks
    (`--compile.enable`: each block through `nn.Module.compile`, after torchtitan's own selective
    activation checkpointing, `SelectiveAC`, its default): the block as torchtitan builds it for
    `flavor`, its parameters in bf16 (FSDP2's param_dtype, torchtitan's default), called as the
    model calls it with a (batch, seq, dim) bf16 input, the document-causal BlockMask torchtitan
    makes from the batch's positions (one document per row) and those positions; dynamo,
    AOTAutograd with inductor's decompositions and partition, on the CPU's fakes. FSDP2's hooks
    are not on the block here: dynamo never traces them (they run eager around the graph)."""
    from unittest import mock

    import torchtitan.models.common.attention as attention
    from torch._subclasses import FakeTensorMode
    from torch.nn.attention.flex_attention import create_block_mask
    from torchtitan.distributed.activation_checkpoint import SelectiveAC
    from torchtitan.models.llama3 import model_registry

    model = model_registry(flavor).model.build()
    SelectiveAC(SelectiveAC.Config()).apply(model)
    for p in model.parameters():
        p.data = p.data.to(torch.bfloat16)
    positions = torch.arange(seq).repeat(batch, 1)
    with mock.patch.object(attention, "_compiled_create_block_mask", create_block_mask):   # (eager: no C++ compiler)
        masks = model.get_attention_masks(positions=positions)
    block = next(iter(model.layers.values()))

    def call(backend):
        import torch.nn.attention.flex_attention as flex

        with FakeTensorMode(allow_non_fake_inputs=True) as mode, \
                mock.patch.object(flex, "_validate_device", lambda *args: None):   # (CPU: no flex backward)
            x = torch.empty(batch, seq, model.config.dim, dtype=torch.bfloat16).requires_grad_()
            fake_positions = mode.from_tensor(positions)
            torch.compile(block, backend=backend)(x, masks, fake_positions).sum().backward()

    return dynamo_saved_per_graph(call, None, None)


# ============================================================================ FSDP2, compiled
FSDP_BLOCK = """
class Block(torch.nn.Module):   # a module class of the program's own
    def __init__(self, width):
        super().__init__()
        self.up, self.down = torch.nn.Linear(width, 2 * width), torch.nn.Linear(2 * width, width)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))
"""


def fsdp_compiled_saved(kind: str, width: int, batch: int) -> list[list[int]]:
    """Each graph's saved storages, in the order dynamo makes them, for `torch.compile(model)`
    after FSDP2's `fully_shard(model)`: `kind` "block" (FSDP_BLOCK, a class of the program's) or
    "sequential" (torch's Sequential of the same layers). FSDP2's hooks are dynamo-disabled; torch
    compiles the block's forward as one graph and nothing of the Sequential (dynamo skips torch's
    own forward as a frame). On the CPU under torch's fake process group (2 ranks)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    scope: dict = {"torch": torch}
    exec(FSDP_BLOCK, scope)

    def call(backend):
        if kind == "block":
            model = scope["Block"](width)
        else:
            model = torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.GELU(),
                                        torch.nn.Linear(2 * width, width))
        fully_shard(model)
        torch.compile(model, backend=backend)(torch.randn(batch, width)).sum().backward()

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        return dynamo_saved_per_graph(call, None, None)
    finally:
        dist.destroy_process_group()
