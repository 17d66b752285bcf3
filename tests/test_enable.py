"""Swap-in without a GPU: enable() builds and installs torch's CUDAPluggableAllocator from our
shared library (torch allows that on a machine with no GPU), refuses once CUDA is initialized,
and `amem run`, `python -m amem_alloc run` and AMEM_ENABLE=1 put it in place before user code."""
import ctypes
import sys

import pytest

from helpers import run_command, run_python

pytest.importorskip("torch")


def test_enable_installs_the_pluggable_allocator():
    proc = run_python("""
        import torch, amem_alloc
        from amem_alloc.cuda import _state
        assert not amem_alloc.is_enabled()
        amem_alloc.enable(max_split_size_mb=64)
        assert amem_alloc.is_enabled()
        assert torch._C._cuda_getAllocator() is _state["allocator"]._allocator
        amem_alloc.enable(max_split_size_mb=64)          # same options again: a no-op
        print("settings", amem_alloc._C.cuda_settings())
    """)
    assert proc.returncode == 0, proc.stderr
    assert "max_split_size_mb:64" in proc.stdout


def test_enable_twice_with_other_options_says_why():
    proc = run_python("""
        import amem_alloc
        amem_alloc.enable()
        try:
            amem_alloc.enable(max_split_size_mb=64)
        except RuntimeError as err:
            print("refused:", err)
    """)
    assert "refused: amem is already enabled" in proc.stdout, proc.stderr


def test_enable_after_cuda_initialized_raises_and_explains():
    proc = run_python("""
        import torch, amem_alloc
        torch.cuda.is_initialized = lambda: True   # what a process with a CUDA context reports
        try:
            amem_alloc.enable()
        except RuntimeError as err:
            print("refused:", err)
        print("enabled:", amem_alloc.is_enabled())
    """)
    assert "before CUDA is initialized" in proc.stdout
    assert "amem run" in proc.stdout            # says what to do instead
    assert "enabled: False" in proc.stdout


def test_enable_with_bad_option_raises_valueerror_and_installs_nothing():
    proc = run_python("""
        import torch, amem_alloc
        for kwargs in ({"max_split_size_mb": 3}, {"no_such_option": 1}, {"garbage_collection_threshold": 1.5}):
            try:
                amem_alloc.enable(**kwargs)
            except ValueError as err:
                print("ValueError:", err)
        print("enabled:", amem_alloc.is_enabled(), torch._C._cuda_getAllocator())
    """)
    assert proc.stdout.count("ValueError:") == 3, proc.stdout + proc.stderr
    assert "'max_split_size_mb'" in proc.stdout and "'no_such_option'" in proc.stdout
    assert "'garbage_collection_threshold'" in proc.stdout
    assert "enabled: False None" in proc.stdout


def test_amem_conf_environment_is_used_and_kwargs_override_it():
    proc = run_python("""
        import amem_alloc
        amem_alloc.enable(roundup_power2_divisions=4)
        print(amem_alloc._C.cuda_settings())
    """, env={"AMEM_CONF": "max_split_size_mb:128,roundup_power2_divisions:2"})
    assert "max_split_size_mb:128" in proc.stdout, proc.stderr
    assert "roundup_power2_divisions:4" in proc.stdout


def test_amem_enable_environment_enables_any_python_process():
    probe = "import amem_alloc; print('enabled:', amem_alloc.is_enabled())"
    assert "enabled: True" in run_python(probe, env={"AMEM_ENABLE": "1"}).stdout
    assert "enabled: False" in run_python(probe).stdout


@pytest.mark.parametrize("launcher", [["amem"], ["-m", "amem_alloc"]])
def test_run_starts_a_script_with_amem_in_place(tmp_path, launcher):
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, amem_alloc\n"
        "print('enabled:', amem_alloc.is_enabled(), 'args:', sys.argv[1:], 'name:', __name__)\n"
        "sys.exit(3)\n"
    )
    from pathlib import Path
    exe = [str(Path(sys.executable).parent / "amem")] if launcher == ["amem"] else [sys.executable, *launcher]
    proc = run_command([*exe, "run", str(script), "--lr", "0.1"])
    assert "enabled: True args: ['--lr', '0.1'] name: __main__" in proc.stdout, proc.stderr
    assert proc.returncode == 3  # the script's exit status comes through


def test_c_entry_points_handle_size_zero_and_null_without_cuda():
    import amem_alloc._C as C

    lib = ctypes.CDLL(C.__file__)
    lib.amem_malloc.restype = ctypes.c_void_p
    lib.amem_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.amem_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    assert lib.amem_malloc(0, 0, None) is None           # empty tensors get a null pointer
    lib.amem_free(None, 0, 0, None)                      # ...and freeing it is a no-op
    lib.amem_empty_cache()                               # no device used yet: nothing to do
    lib.amem_init(1)
    assert C.cuda_devices_in_use() == []                 # nothing was created on the way


def test_memory_stats_of_an_unused_device_are_zero_with_torch_keys():
    import amem_alloc

    stats = amem_alloc.memory_stats(0)
    assert stats["allocated_bytes.all.current"] == 0 and stats["reserved_bytes.all.peak"] == 0
    for key in ("active_bytes.large_pool.freed", "requested_bytes.small_pool.current", "num_alloc_retries",
                "num_ooms", "num_device_alloc", "num_device_free", "segment.all.current", "max_split_size"):
        assert key in stats
    assert amem_alloc.segments(0) == []
    with pytest.raises(ValueError, match="out of range"):
        amem_alloc.memory_stats(10_000)
    with pytest.raises(ValueError, match="negative"):
        amem_alloc.memory_stats(-1)
