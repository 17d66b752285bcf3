"""DeepSpeed ZeRO under prediction (tests/predict_models/dist_deepspeed.py: `deepspeed.initialize`,
bf16, torch's AdamW, DeepSpeed's defaults otherwise), every rank in this process one after another,
each with its own fresh DeepSpeed (fresh_libraries.py: rank 0's process groups had carried into rank
1, "Group ... is not registered"). Per rank, against what DeepSpeed's code does (0.19;
deepspeed/runtime/zero/stage_1_and_2.py, stage3.py, partition_parameters.py), to the byte.

The model: Linear(1000, 1000), Linear(1000, 1000), Linear(1000, 10) with biases, N = 2,012,010
parameters; W ranks.

ZeRO-1 and ZeRO-2 (DeepSpeedZeroOptimizer): the parameters of the one param group are flattened into
one bf16 buffer padded to a multiple of 2 W elements (`alignment = nccl_start_alignment_factor (2) *
world`, so every partition starts 4-byte aligned; `parameter_alignment` is off by default); the
model's parameters become views into it. Each rank owns P = padded / W elements of it: its fp32
master partition (P x 4 B, `single_partition_of_fp32_groups`), AdamW's exp_avg and exp_avg_sq of it
(2 x P x 4 B; `step` on the CPU: foreach, not capturable) and, for the step, its fp32 gradient
partition (P x 4 B, set as the partition's .grad for the inner optimizer's step and freed after it,
before ZeRO's own step returns: the end of the training step, where --steps counts it).
Every backward fills an IPG bucket: `contiguous_gradients` (default on) makes `setup_buckets`
allocate one buffer of `reduce_bucket_size` (default 5e8) elements of the bf16 reduction dtype,
1e9 B (a second one only with `overlap_comm`, off by default for stages 1 and 2), released at the
end of backward (`_release_ipg_buffers`). The updated bf16 partitions are all-gathered into the flat
buffer in place (`all_gather_into_tensor`: `allgather_bucket_size` plays no part).

ZeRO-3 (DeepSpeedZeroOptimizer_Stage3): each parameter is padded to a multiple of W and split, so a
rank owns S = sum over parameters of ceil(numel / W) elements: its bf16 partitions moved into one
flat buffer (`defragment`, S x 2 B), its fp32 master partition (one sub-group: `sub_group_size`
1e12; S x 4 B), AdamW's two states (2 x S x 4 B), a bf16 gradient partition buffer for the whole
run (`grad_partitions_flat_buffer`, S x 2 B), the fp32 gradient for the step (S x 4 B, freed as
its sub-group is stepped), and the IPG bucket allocated once at initialisation and held (5e8 bf16
elements, 1e9 B). As its step ends (`_post_step`), the parameters of at most
`param_persistence_threshold` (1e5) elements, here the biases and the last weight (12,010), are
all-gathered whole and stay gathered (each into its padded partitions: ceil(n / W) W elements). Full parameters
all-gathered for forward and backward come and go as DeepSpeed's prefetcher decides (one can stay
gathered across steps, within `stage3_max_reuse_distance`); they are left out of the comparison.
Categories: ZeRO-3's bf16 partitions, its gradient partition buffer and its IPG bucket are made
with grad enabled before the first forward and are alive in backward, so the engine calls them
activations; their bytes are checked by where DeepSpeed made them."""
import importlib.util
import math
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("deepspeed") is None:   # not imported here: each rank imports its own
    pytest.skip("DeepSpeed is not installed (DS_BUILD_OPS=0 pip install deepspeed)", allow_module_level=True)

from amem_alloc.predict.distributed.launch import Launch  # noqa: E402
from amem_alloc.predict.distributed.ranks import predict_ranks  # noqa: E402
from amem_alloc.replay import ALLOC, FREE  # noqa: E402
from test_predict_distributed import live_at_end  # noqa: E402

MODELS = Path(__file__).parent / "predict_models"
SHAPES = [(1000, 1000), (1000,), (1000, 1000), (1000,), (10, 1000), (10,)]
N = sum(math.prod(s) for s in SHAPES)
IPG_BUCKET = 500_000_000 * 2   # reduce_bucket_size's default, bf16
PERSISTENT = [math.prod(s) for s in SHAPES if math.prod(s) <= 100_000]   # param_persistence_threshold


def _predict(stage: int, world: int, ranks: tuple, monkeypatch):
    monkeypatch.setenv("ZERO", str(stage))
    return predict_ranks(Launch(world, 1, ranks), [str(MODELS / "dist_deepspeed.py")], "H100", "torch",
                         steps=3, timeout=600, workers=1)


def _live_at_last_step(prediction) -> list:
    """The AllocInfo of each storage live at the last optimizer step's end."""
    last = [i for i, name in prediction.markers if name == "step"][-1]
    live: dict = {}
    for kind, key, size, _ in prediction.ops[:last]:
        if kind == ALLOC:
            live[key] = size
        elif kind == FREE:
            live.pop(key, None)
    return [prediction.infos[key] for key in live]


def _most_during_last_step(prediction, category: str) -> int:
    """The most requested bytes of `category` live at once during the last optimizer step (from the
    step before it's end to its own)."""
    steps = [i for i, name in prediction.markers if name == "step"]
    live, most = {}, 0
    for i, (kind, key, size, _) in enumerate(prediction.ops[:steps[-1]]):
        if kind == ALLOC and prediction.infos[key].category == category:
            live[key] = size
        elif kind == FREE:
            live.pop(key, None)
        if i >= steps[-2]:
            most = max(most, sum(live.values()))
    return most


def _made_in(frames, function: str) -> bool:
    return any(f[2] == function for f in frames)


@pytest.mark.parametrize("stage, world", [(1, 2), (2, 2), (2, 4)])
def test_zero_1_and_2_hold_the_padded_flat_buffer_and_their_partition_of_the_fp32_state(stage, world, monkeypatch):
    padded = math.ceil(N / (2 * world)) * 2 * world
    part = padded // world
    ranks = (0, world - 1)   # the last rank's partition holds the padding
    result = _predict(stage, world, ranks, monkeypatch)
    for rank in ranks:
        p = result.rank(rank).prediction
        state = live_at_end(p)
        assert (state.get("parameter"), state.get("optimizer_state"), state.get("gradient")) == (
            padded * 2 + part * 4, 2 * part * 4, None), (stage, world, rank, state)
        assert _most_during_last_step(p, "gradient") == part * 4
        steps = [i for i, name in p.markers if name == "step"]
        buckets = [i for i, (kind, _, size, _) in enumerate(p.ops) if kind == ALLOC and size == IPG_BUCKET]
        assert len(buckets) == len(steps) == 3, (buckets, steps)
        for made, step in zip(buckets, steps):   # one bucket per backward, gone before its step
            key = p.ops[made][1]
            freed = next(i for i in range(made, len(p.ops)) if p.ops[i][0] == FREE and p.ops[i][1] == key)
            assert made < freed < step and _made_in(p.infos[key].frames, "setup_buckets")


def test_deepspeeds_own_fused_adam_is_never_built_and_steps_in_place(monkeypatch):
    """The config's "AdamW" without torch_adam makes DeepSpeed's FusedAdam, whose CUDA op nvcc
    builds as it loads: with no GPU toolkit the build failed ("cusparse.h: No such file"), read as
    the script's failure. Under prediction the op is a stand-in doing nothing (its kernel updates in
    place, allocating nothing), said so; the state is FusedAdam's own, the same bytes as torch's
    AdamW here."""
    monkeypatch.setenv("TORCH_ADAM", "0")
    world = 2
    padded = math.ceil(N / (2 * world)) * 2 * world
    part = padded // world
    result = _predict(2, world, (0, 1), monkeypatch)
    for rank in (0, 1):
        p = result.rank(rank).prediction
        state = live_at_end(p)
        assert (state.get("parameter"), state.get("optimizer_state"), state.get("gradient")) == (
            padded * 2 + part * 4, 2 * part * 4, None), (rank, state)
        assert _most_during_last_step(p, "gradient") == part * 4
        assert any("DeepSpeed's CUDA op fused_adam: not built" in n["what"] for n in p.notes), p.notes


@pytest.mark.parametrize("world", [2, 4])
def test_zero_3_holds_each_parameters_padded_partition_and_its_buffers(world, monkeypatch):
    s = sum(math.ceil(math.prod(shape) / world) for shape in SHAPES)
    persistent = [math.ceil(n / world) * world * 2 for n in PERSISTENT]   # bytes, gathered whole
    ranks = (0, world - 1)
    linear = torch.nn.functional.linear
    result = _predict(3, world, ranks, monkeypatch)
    # ZeRO-3 replaces F.linear for the process ("This will persist unless manually reset"): each
    # rank's replacement is undone after it (fresh_libraries.py), else a DDP job predicted next in
    # this process had its gradients ready in another order, and other buckets
    assert torch.nn.functional.linear is linear
    expected = {"defragment": [s * 2],                                   # the bf16 partitions, one flat buffer
                "_create_fp32_partitions": [s * 4],                      # the fp32 master partition
                "_setup_for_real_optimizer": sorted([s * 2, IPG_BUCKET]),  # gradient partitions, IPG bucket
                "step_with_gradscaler": [s * 4, s * 4],                  # AdamW's exp_avg, exp_avg_sq
                "<module>": [8 * 1000 * 2],                              # the script's batch (bf16) it holds
                "_allgather_params_coalesced": sorted(b for b in persistent if b >= 1000)}  # gathered in _post_step
    for rank in ranks:
        p = result.rank(rank).prediction
        state = live_at_end(p)
        # parameters: the bf16 partitions (each parameter's ds_tensor, a view of one flat buffer), the
        # fp32 master partition and the persistent parameters gathered whole
        assert (state.get("parameter"), state.get("optimizer_state"), state.get("gradient")) == (
            s * 2 + s * 4 + sum(persistent), 2 * s * 4, None), (world, rank, state)
        assert _most_during_last_step(p, "gradient") == s * 4   # the fp32 gradient for the step
        by_function: dict = {}
        for info in _live_at_last_step(p):
            gathered = _made_in(info.frames, "wait")   # a full parameter all-gathered (left out, above)
            if info.requested >= 1000 and info.op != "cublas_workspace" and not gathered:
                by_function.setdefault(info.frames[0][2], []).append(info.requested)
        assert {k: sorted(v) for k, v in by_function.items()} == expected, (world, rank, by_function)


def test_hf_trainer_with_a_deepspeed_zero_2_config_holds_each_ranks_partitions(monkeypatch):
    """transformers' Trainer with `deepspeed="ds_zero2.json"` (tests/programs/hf_trainer.py --bf16
    --deepspeed, GPT-2 of 541,184 parameters), 2 ranks. The Trainer makes the optimizer (its default,
    fused torch AdamW) with two parameter groups, decayed and not (biases and LayerNorms:
    trainer.py `get_decay_parameter_names`), and DeepSpeed flattens and pads each group on its own.
    Per rank, for each group of n elements padded to n' = ceil(n / 2W) 2W: its bf16 flat buffer
    (n' x 2 B), its fp32 partition (n' / W x 4 B) and AdamW's two states of it, plus fused AdamW's
    4-byte step count on the GPU per group. DeepSpeed steps the inner optimizer once per group from
    its own step, which is one step to --steps (counted one by one, --steps 4 stopped the Trainer's
    3 steps inside the second): at
    its end both groups' fp32 gradient partitions are freed; during it each lives for its group's
    step, the larger one the most."""
    pytest.importorskip("transformers")
    from transformers import GPT2Config, GPT2LMHeadModel

    world = 2
    monkeypatch.chdir(Path(__file__).parent / "programs")
    result = predict_ranks(Launch(world, 1, (0, 1)), ["hf_trainer.py", "--bf16", "--deepspeed", "ds_zero2.json"],
                           "H100", "torch", steps=4, timeout=600, workers=1)
    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=128,
                                           bos_token_id=999, eos_token_id=999))
    norms = {id(p) for m in model.modules() if isinstance(m, torch.nn.LayerNorm) for p in m.parameters()}
    groups = [0, 0]   # decayed, not decayed
    for name, p in model.named_parameters():
        groups[name.endswith("bias") or id(p) in norms] += p.numel()
    assert sum(groups) == 541_184
    padded = [math.ceil(n / (2 * world)) * 2 * world for n in groups]
    parts = [n // world for n in padded]
    for rank in (0, 1):
        p = result.rank(rank).prediction
        state = live_at_end(p)
        assert (state.get("parameter"), state.get("optimizer_state"), state.get("gradient")) == (
            sum(padded) * 2 + sum(parts) * 4, 2 * sum(parts) * 4 + 4 * 2, None), (rank, state)
        assert _most_during_last_step(p, "gradient") == max(parts) * 4
        assert [name for _, name in p.markers].count("step") == 3   # the Trainer's max_steps (was 6)


def test_deepspeed_the_caller_imported_on_the_cpu_is_imported_afresh_on_the_fake_gpu(monkeypatch):
    """Imported here, outside prediction, DeepSpeed picks its CPU accelerator (no GPU: "Setting
    accelerator to CPU") and keeps it for the process (real_accelerator.py `ds_accelerator`). Each
    rank imports its own DeepSpeed, which sees the fake GPU and picks CUDA (with the caller's, ZeRO-2
    put its partitions on the CPU and the rank failed: "attempting to assign a gradient with device
    type 'cpu' to a tensor with device type 'meta'"); the caller's is its own again after."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    assert get_accelerator().device_name() == "cpu"
    result = _predict(2, 2, (0, 1), monkeypatch)
    assert [r.steps for r in result.ranks] == [3, 3]
    assert sys.modules["deepspeed"] is deepspeed and get_accelerator().device_name() == "cpu"


def test_a_host_op_given_host_copies_of_fake_tensors_skips_them():
    """ZeRO-Offload's DeepSpeedCPUAdam steps the host copy of the fake fp32 partition (a meta tensor
    answering "cpu") with its C++ op, which read it: at dc9fe6c the prediction of an HF run_clm.py
    with `offload_optimizer: cpu` ended in a segmentation fault. An op's call given such a tensor
    is skipped; given real host tensors it runs."""
    import amem_alloc
    from deepspeed.ops.op_builder.builder import OpBuilder

    calls = []

    class Ops:
        @staticmethod
        def adam_update(step, param, grad):
            calls.append((step, param.sum().item()))

    class HostAdam(OpBuilder):
        NAME = "host_adam_stub"

        def __init__(self):
            super().__init__(name=self.NAME)

        def absolute_name(self):
            return f"deepspeed.ops.adam.{self.NAME}_op"

        def sources(self):
            return []

        def jit_load(self, verbose=True):
            return Ops

    def step():
        ops = HostAdam().load()
        partition = torch.randn(10, device="cuda").cpu()   # a host copy of a fake tensor
        partition.grad = torch.zeros(10)
        ops.adam_update(1, partition, partition.grad)
        ops.adam_update(2, torch.ones(10), torch.zeros(10))

    amem_alloc.predict(step, gpu="H100")
    assert calls == [(2, 10.0)]


def test_any_other_cuda_op_is_never_built_and_says_it_is_not_modelled_when_called():
    """An op that computes a result (the inference kernels) cannot be stood in for by doing
    nothing: its call is amem's one line, not nvcc's failure read as the script's."""
    import amem_alloc
    from amem_alloc.predict.notes import NotModelledError
    from deepspeed.ops.op_builder.builder import CUDAOpBuilder

    class Kernels(CUDAOpBuilder):
        NAME = "kernels_stub"

        def __init__(self):
            super().__init__(name=self.NAME)

        def absolute_name(self):
            return f"deepspeed.ops.{self.NAME}_op"

        def sources(self):
            return ["never_built.cu"]

    loaded = []

    def run():
        ops = Kernels().load()   # never compiled
        loaded.append(type(ops).__name__)
        ops.softmax(torch.randn(4, device="cuda"))

    with pytest.raises(NotModelledError, match=r"DeepSpeed's CUDA op kernels_stub.softmax"):
        amem_alloc.predict(run, gpu="H100")
    assert loaded == ["UnbuiltCudaOps"]
