"""The meta device as torch has it, under prediction: tensors made on meta — by a
`torch.device("meta")` context, `device="meta"` or `.to("meta")` — stay meta (device and is_meta)
and take no memory; `to_empty(device="cuda")` allocates what a GPU allocates."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import amem_alloc  # noqa: E402


def _predict(body):
    seen = {}
    p = amem_alloc.predict(lambda: body(seen), gpu="H100")
    return seen, p


def test_meta_tensors_stay_meta_and_take_no_memory():
    def body(seen):
        with torch.device("meta"):
            a = torch.arange(0, 8, 2).float()
            lin = torch.nn.Linear(16, 16)
        b = torch.empty(4, device="meta")
        c = torch.randn(4, device="cuda").to("meta")
        seen.update(ctx=(a.device.type, a.is_meta, lin.weight.device.type, lin.weight.is_meta),
                    kw=(b.device.type, b.is_meta, (b * 2).device.type, (b * 2).is_meta),
                    to=(c.device.type, c.is_meta), cuda_is_meta=torch.ones(1, device="cuda").is_meta)
    seen, p = _predict(body)
    assert seen == {"ctx": ("meta", True, "meta", True), "kw": ("meta", True, "meta", True),
                    "to": ("meta", True), "cuda_is_meta": False}
    assert sorted(i.requested for i in p.infos.values()) == [4, 16]   # the two CUDA tensors only


def test_to_empty_allocates_on_cuda_what_the_module_holds():
    def body(seen):
        with torch.device("meta"):
            lin = torch.nn.Linear(64, 32)
        lin.to_empty(device="cuda")
        torch.nn.init.kaiming_uniform_(lin.weight)
        seen["after"] = (lin.weight.device.type, lin.weight.is_meta, lin.bias.is_cuda)
    seen, p = _predict(body)
    assert seen["after"] == ("cuda", False, True)
    assert sorted((i.requested, i.op) for i in p.infos.values()) == [(32 * 4, "empty_like.default"),
                                                                      (64 * 32 * 4, "empty_like.default")]


def test_host_copies_of_meta_tensors_of_one_shape_are_all_on_the_host():
    """Failed at 9534256: the Recorder's meta cache kept the first `empty_like(meta, device="cpu")`
    by its inputs' shapes and made every later one as a meta tensor. transformers moves a model's
    non-persistent buffers off meta so after `from_pretrained`: a llama's `original_inv_freq`, of
    `inv_freq`'s shape, stayed on meta, and the script then read as holding meta tensors of its own."""
    def body(seen):
        with torch.device("meta"):
            a = torch.arange(4.)
            b = a.clone()
        seen["devices"] = [torch.empty_like(t, device="cpu").device.type for t in (a, b, a * 2)]
        seen["zeros"] = torch.zeros_like(b, device="cpu").device.type
    seen, _ = _predict(body)
    assert seen == {"devices": ["cpu", "cpu", "cpu"], "zeros": "cpu"}


def test_a_model_the_program_deletes_is_freed_after_it_ran():
    """Failed at 9534256: the module scope kept every outermost module that ran, so `del model`
    freed nothing and later peaks carried it (diffusers' DreamBooth with prior preservation deletes
    its class-image pipeline before training: +1.9 GiB on SD1.5)."""
    import gc
    import weakref

    MiB = 1 << 20
    seen = {}

    def body(_):
        model = torch.nn.Linear(1024, 1024).cuda()   # 4 MiB of weight
        with torch.no_grad():
            model(torch.randn(8, 1024, device="cuda"))
        alive = weakref.ref(model)
        del model
        gc.collect()
        seen["alive"] = alive() is not None
        torch.empty(16 * MiB, dtype=torch.uint8, device="cuda")   # the peak, after the delete

    _, p = _predict(body)
    assert seen["alive"] is False
    peak = max(r.peak_allocated for r in p.rows)
    assert peak < 16 * MiB + 4 * MiB + 32 * MiB, peak   # the weight is not part of the peak (32 MiB: cuBLAS's workspace)
    weights = [i for i in p.infos.values() if i.requested == 4 * MiB]
    assert [i.category for i in weights] == ["parameter"]   # learnt as it first ran, though gone at the end
