"""Drop-in parity without a GPU: the hooks torch calls exist and behave (driven through the real C
entry points on the host backend), torch's own memory functions report amem's figures in torch's
formats, and an out-of-memory in the plugin reaches Python as torch.OutOfMemoryError through
torch's own bindings. Each scenario runs in a fresh process (the allocator is swapped once)."""
import pytest

from helpers import run_python

pytest.importorskip("torch")

PRELUDE = """
import ctypes, json, torch, amem_alloc
from amem_alloc import _C
_C.registry_use_backend("host", 256 << 20)     # the C entry points serve "device 0" from host memory
amem_alloc.enable({kwargs})
lib = ctypes.CDLL(_C.__file__)
lib.amem_malloc.restype = ctypes.c_void_p
lib.amem_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
lib.amem_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
lib.amem_record_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
lib.amem_set_memory_fraction.argtypes = [ctypes.c_double, ctypes.c_int]
MiB = 1 << 20
"""


def run(body: str, kwargs: str = ""):
    proc = run_python(PRELUDE.format(kwargs=kwargs) + body)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_every_hook_is_registered_with_an_exported_function():
    out = run("""
        from amem_alloc.cuda import HOOKS
        for setter, symbol in HOOKS.items():
            assert hasattr(torch._C._CUDAPluggableAllocator, setter), setter
            assert getattr(lib, symbol), symbol
        print("hooks", sorted(HOOKS.values()))
    """.replace("\n        ", "\n"))
    assert "amem_record_stream" in out and "amem_set_memory_fraction" in out and "amem_empty_cache" in out


def test_c_entry_points_allocate_write_and_free_on_the_host_backend():
    out = run("""
p = lib.amem_malloc(3 * MiB, 0, None)
ctypes.memset(p, 0xAB, 3 * MiB)                   # real memory behind the pointer
assert ctypes.string_at(p + 3 * MiB - 4, 4) == b"\\xab" * 4
s = amem_alloc.memory_stats(0)
print("allocated", s["allocated_bytes.all.current"], "requested", s["requested_bytes.all.current"])
lib.amem_free(p, 3 * MiB, 0, None)
lib.amem_free(p, 3 * MiB, 0, None)                # a double free from torch: reported, ignored
print("after", amem_alloc.memory_stats(0)["allocated_bytes.all.current"],
      amem_alloc.memory_stats(0)["num_invalid_frees"])
_C.cuda_check_valid(0)
""")
    assert f"allocated {3 << 20} requested {3 << 20}" in out
    assert "after 0 1" in out


def test_record_stream_hook_defers_reuse_until_the_stream_event():
    out = run("""
p = lib.amem_malloc(4096, 0, None)
lib.amem_record_stream(p, 7)                      # used on stream 7 as well
lib.amem_free(p, 4096, 0, None)
states = [b.state for s in amem_alloc.segments(0) for b in s.blocks]
print("pending" if "active_pending_free" in states else "not pending")
lib.amem_record_stream(12345, 7)                  # a pointer amem does not hold: ignored, reported
q = lib.amem_malloc(4096, 0, None)                # the event has completed: the block is reused
print("reused", q == p)
""")
    assert "pending" in out.split() and "reused True" in out


def test_memory_fraction_hook_caps_what_amem_reserves():
    out = run("""
lib.amem_set_memory_fraction(0.25, 0)            # 64 MiB of the 256 MiB host "device"
ok = _C.cuda_malloc(0, 40 * MiB, 0)
try:
    _C.cuda_malloc(0, 40 * MiB, 0)
except amem_alloc.OutOfMemoryError as err:
    print("capped:", "memory fraction caps amem at 64.00 MiB" in str(err))
""")
    assert "capped: True" in out


def test_out_of_memory_reaches_python_as_torch_out_of_memory_error():
    out = run("""
from amem_alloc.cuda import _state
assert _C.torch_oom_available()
print(_C.torch_oom_check("probe").split(":")[0])
pluggable = _state["allocator"]._allocator
pluggable.set_reset_fn(ctypes.cast(lib.amem_selftest_throw_oom, ctypes.c_void_p).value)
try:
    torch._C._cuda_emptyCache()                   # torch's binding -> the plugin -> throw
except torch.OutOfMemoryError as err:
    print("caught torch.OutOfMemoryError:", "self-test" in str(err))
""")
    assert "N3c1016OutOfMemoryErrorE" in out
    assert "caught torch.OutOfMemoryError: True" in out


def test_the_oom_message_says_what_happened_and_what_to_try():
    out = run("""
try:
    _C.cuda_malloc(0, 300 * MiB, 0)
except amem_alloc.OutOfMemoryError as err:
    print(err)
""")
    for part in ("tried to allocate 300.00 MiB", "Reserved by amem", "allocated:", "device free:",
                 "largest cached free block", "fragmentation", "Try "):
        assert part in out


def test_torch_memory_functions_report_amem_figures_in_torch_formats(tmp_path):
    path = tmp_path / "snap.pickle"
    out = run(f"""
p = lib.amem_malloc(3 * MiB, 0, None)
q = lib.amem_malloc(1000, 0, None)
mine = amem_alloc.memory_stats(0)
theirs = torch.cuda.memory_stats(0)
assert dict(theirs) == mine, "torch.cuda.memory_stats differs from amem's"
assert torch.cuda.memory_allocated(0) == mine["allocated_bytes.all.current"] == 3 * MiB + 1024
assert torch.cuda.memory_reserved(0) == mine["reserved_bytes.all.current"]
assert torch.cuda.max_memory_allocated(0) == 3 * MiB + 1024
lib.amem_free(p, 0, 0, None)
torch.cuda.reset_peak_memory_stats(0)
assert torch.cuda.max_memory_allocated(0) == 1024
summary = torch.cuda.memory_summary(0)
assert "Allocated memory" in summary and "PyTorch CUDA memory summary" in summary
segments = torch.cuda.memory_snapshot()
assert {{b["state"] for s in segments for b in s["blocks"]}} >= {{"active_allocated", "inactive"}}
torch.cuda.memory._dump_snapshot({str(path)!r})
torch._C._cuda_emptyCache()                       # torch's empty_cache path -> amem's reset hook
print("reserved after empty_cache", torch.cuda.memory_reserved(0))
print("ok")
""")
    assert "ok" in out and "reserved after empty_cache 2097152" in out  # the 2 MiB small segment stays (q is live)
    assert path.stat().st_size > 0


def test_patch_torch_false_leaves_torch_alone_and_unpatch_restores():
    out = run("""
import torch.cuda.memory as m
print("patched", m.memory_stats_as_nested_dict.__module__)
""", kwargs="patch_torch=False")
    assert "patched torch.cuda.memory" in out
    out = run("""
import torch.cuda.memory as m
from amem_alloc import torch_patch
before = m.memory_stats_as_nested_dict.__module__
torch_patch.unpatch()
print(before, m.memory_stats_as_nested_dict.__module__, torch.cuda.reset_peak_memory_stats.__module__)
""")
    assert "amem_alloc.torch_patch torch.cuda.memory torch.cuda.memory" in out


def test_profiler_with_profile_memory_sees_amem_allocations():
    out = run("""
from torch.profiler import profile, ProfilerActivity
assert _C.profiler_hooks_available()
with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
    p = lib.amem_malloc(3 * MiB, 0, None)
    lib.amem_free(p, 0, 0, None)
usage = [e.device_memory_usage for e in prof.events() if e.name == "[memory]"]
print("usage", usage)
""")
    assert f"usage [{3 << 20}, {-(3 << 20)}]" in out
