"""amem as torch's real CUDA allocator. Every scenario runs in a fresh process, because the
allocator can be swapped in only before CUDA starts; a native-allocator run of the same script
is the reference. Run with `make test-gpu` on a machine with a GPU."""
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import DETERMINISTIC_TRAINING_START, run_python  # noqa: E402

pytestmark = pytest.mark.gpu

TRAIN = DETERMINISTIC_TRAINING_START + """
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
gen = torch.Generator().manual_seed(1)
losses = []
for step in range(30):
    x = torch.randn(64 + step, 256, generator=gen).cuda()   # a changing batch size
    y = torch.randint(0, 10, (64 + step,), generator=gen).cuda()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    losses.append(loss.item())
print(json.dumps({"losses": losses, "weight_sum": float(sum(p.double().sum() for p in model.parameters()))}))
"""


def _json(proc):
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_training_gives_the_same_results_as_the_native_allocator():
    native = _json(run_python(TRAIN, args=["native"]))
    amem = _json(run_python(TRAIN, args=["amem"]))
    assert amem["losses"] == pytest.approx(native["losses"], rel=1e-6, abs=1e-7)
    assert amem["weight_sum"] == pytest.approx(native["weight_sum"], rel=1e-9)


def test_stats_agree_with_tensor_sizes_and_nothing_leaks():
    out = _json(run_python("""
        import json, amem_alloc
        amem_alloc.enable()
        import torch
        sizes = [1, 511, 512, 513, 4096, 1 << 20, (1 << 20) + 1, 5 << 20, 12 << 20, 100 << 20]
        tensors = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in sizes]
        empty = torch.empty(0, device="cuda")                # size 0: a null pointer, no block
        stats = amem_alloc.memory_stats(0)
        live = {"allocated": stats["allocated_bytes.all.current"], "requested": stats["requested_bytes.all.current"],
                "allocations": stats["allocation.all.current"]}
        del tensors, empty
        after_del = amem_alloc.memory_stats(0)["allocated_bytes.all.current"]
        torch.cuda.empty_cache()                             # torch's reset hook -> amem_empty_cache
        final = amem_alloc.memory_stats(0)
        amem_alloc._C.cuda_check_valid(0)
        print(json.dumps({"sizes": sizes, "live": live, "after_del": after_del,
                          "reserved_after_empty": final["reserved_bytes.all.current"],
                          "device_frees": final["num_device_free"]}))
    """))
    rounded = [max(512, (n + 511) // 512 * 512) for n in out["sizes"]]
    assert out["live"] == {"allocated": sum(rounded), "requested": sum(out["sizes"]), "allocations": len(rounded)}
    assert out["after_del"] == 0
    assert out["reserved_after_empty"] == 0 and out["device_frees"] > 0


def test_out_of_memory_is_an_error_and_the_process_carries_on():
    proc = run_python("""
        import amem_alloc
        amem_alloc.enable()
        import torch
        try:
            torch.empty(1 << 50, dtype=torch.uint8, device="cuda")   # 1 PiB
        except RuntimeError as err:                                  # torch.OutOfMemoryError is one
            print("raised:", "out of memory" in str(err))
        x = torch.ones(1 << 20, device="cuda")
        print("after:", float(x.sum()), amem_alloc.memory_stats(0)["num_ooms"])
    """)
    assert "raised: True" in proc.stdout, proc.stderr
    assert "after: 1048576.0 1" in proc.stdout


def test_a_device_that_does_not_exist_gets_a_clear_error():
    proc = run_python(f"""
        import amem_alloc
        amem_alloc.enable()
        import torch
        try:
            torch.empty(10, device="cuda:{torch.cuda.device_count()}")
        except Exception as err:
            print("error:", err)
    """)
    assert "error:" in proc.stdout and ("invalid device" in proc.stdout.lower() or "does not exist" in proc.stdout)


def test_training_with_expandable_segments_gives_the_same_results():
    native = _json(run_python(TRAIN, args=["native"]))
    amem = _json(run_python(TRAIN, args=["amem"], env={"AMEM_CONF": "expandable_segments:True"}))
    assert amem["losses"] == pytest.approx(native["losses"], rel=1e-6, abs=1e-7)
    assert amem["weight_sum"] == pytest.approx(native["weight_sum"], rel=1e-9)


def test_expandable_segments_map_pages_keep_data_and_give_memory_back():
    out = _json(run_python("""
        import json, amem_alloc
        amem_alloc.enable(expandable_segments=True)
        import torch
        sizes = [1000, 3 << 20, 30 << 20, 7 << 20, 100 << 20]           # small and large pools, many pages
        tensors = [torch.full((n // 4,), float(i + 1), device="cuda") for i, n in enumerate(sizes)]
        mapped = amem_alloc.memory_stats(0)["reserved_bytes.all.current"]
        del tensors[2]                                                  # a hole in the middle
        more = torch.full(((40 << 20) // 4,), 9.0, device="cuda")        # maps pages past the others
        intact = [bool((t == float(v)).all()) for t, v in zip(tensors, [1, 2, 4, 5])] + [bool((more == 9).all())]
        segments = [s for s in amem_alloc.segments(0) if s.is_expandable]
        del tensors, more
        torch.cuda.empty_cache()
        amem_alloc._C.cuda_check_valid(0)
        final = amem_alloc.memory_stats(0)
        print(json.dumps({"mapped": mapped, "intact": intact, "expandable_segments": len(segments),
                          "reserved_after_empty": final["reserved_bytes.all.current"],
                          "device_frees": final["num_device_free"]}))
    """))
    assert out["mapped"] >= sum([1000, 3 << 20, 30 << 20, 7 << 20, 100 << 20])
    assert all(out["intact"]), out["intact"]
    assert out["expandable_segments"] >= 2
    assert out["reserved_after_empty"] == 0 and out["device_frees"] > 0
