"""Byte accounting per device (the CUDA paths are exercised here with amem's lookups stood in for,
so they are tested without a GPU), and the tracer's fallback for torch without
_top_saved_tensors_default_hooks."""
import torch
from torch.utils.checkpoint import checkpoint

import amem_alloc.cuda as amem_cuda
from amem_alloc import Tracer
from amem_alloc.provenance import accounting
from amem_alloc.provenance import tracer as tracer_mod


def test_cpu_sizes_are_nominal_and_the_gpu_rounding():
    b = accounting.block_of(4096, 700, "cpu")
    assert (b.size, b.requested, b.allocator, b.exact) == (1024, 700, "cpu", False)
    assert accounting.block_of(4096, 0, "cpu").size == 0
    assert accounting.block_of(4096, 512, "cpu").size == 512
    assert accounting.block_of(4096, 513, "cpu").size == 1024


def test_cuda_with_amem_reads_the_real_block_and_says_when_amem_has_none(monkeypatch):
    blocks = {4096: {"address": 4096, "size": 1536, "requested_size": 700, "stream": 7, "alloc_seq": 42}}
    seen = []
    monkeypatch.setattr(amem_cuda, "is_enabled", lambda: True)
    monkeypatch.setattr(amem_cuda, "block_info", lambda ptr, dev: seen.append(dev) or blocks.get(ptr))
    b = accounting.block_of(4096, 700, "cuda:1")
    assert (b.size, b.requested, b.stream, b.alloc_seq, b.allocator, b.exact) == (1536, 700, 7, 42, "amem", True)
    assert seen == [1]
    unknown = accounting.block_of(8192, 700, "cuda:0")
    assert (unknown.size, unknown.allocator, unknown.exact) == (1024, "amem-unknown", False)
    assert accounting.exact_blocks_on("cuda") and not accounting.exact_blocks_on("cpu")


def test_cuda_with_the_native_allocator_is_the_rounding(monkeypatch):
    monkeypatch.setattr(amem_cuda, "is_enabled", lambda: False)
    b = accounting.block_of(4096, 700, "cuda:0")
    assert (b.size, b.allocator, b.exact, b.stream) == (1024, "native", False, None)
    assert accounting.segment_of(4096, "cuda:0") is None


def test_rounding_follows_roundup_power2_divisions(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True,roundup_power2_divisions:4")
    conf = accounting._rounding_conf()
    assert conf == "roundup_power2_divisions:4"
    n = 1300 * 1024  # between 1 MiB and 2 MiB: quarters of that interval, so up to 1.5 MiB
    assert accounting.rounded(n, conf) == 1536 * 1024 and accounting.rounded(n, "") == n
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "roundup_power2_divisions:3")  # amem refuses: not a power of 2
    assert accounting._rounding_conf() == ""


def test_without_the_hook_stack_query_slots_are_probed_one_by_one(monkeypatch):
    monkeypatch.setattr(tracer_mod, "_top_hooks", None)  # torch < 2.8
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU())
    x = torch.randn(3, 6, requires_grad=True)
    with Tracer(model) as t:
        y = model(x)
        z = checkpoint(model, y, use_reentrant=False)
    rep = t.activations()
    assert t.hooks_mode == "probe"
    labels = {r["label"]: r for r in rep.saved if r["state"] == "held"}
    assert {"AddmmBackward0.mat1", "AddmmBackward0.mat2", "ReluBackward0.result"} <= set(labels)
    assert labels["ReluBackward0.result"]["nominal_bytes"] == 3 * 6 * 4
    held = [r for r in rep.saved if r["state"] == "other_hooks"]
    assert held and all(r["note"] == "held by other saved_tensors_hooks (checkpoint, offloading): not read"
                        for r in held)
    del z
