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


def test_enable_starts_from_amems_policy_and_the_user_overrides_it_key_by_key():
    from amem_alloc import policies
    from amem_alloc.config import resolve_with_policy
    from amem_alloc._C import canonical_config

    default = resolve_with_policy({}, env={})
    assert default.policy == "amem" and default.conf == policies.get("amem").conf
    assert default.expandable_optional  # the policy's choice: a device that cannot map pages falls back
    assert "expandable_segments:True" in canonical_config(default.conf)
    torch_like = resolve_with_policy({}, env={"AMEM_POLICY": "amem-defaults"})
    assert canonical_config(torch_like.conf) == canonical_config("")  # torch's own decisions
    mine = resolve_with_policy({"large_page_mb": 4}, env={"AMEM_CONF": "expandable_segments:False"})
    settings = canonical_config(mine.conf)
    assert "expandable_segments:False" in settings and "large_page_mb:4" in settings
    assert "cross_stream_reuse:handover" in settings  # what the user did not set stays the policy's
    assert not mine.expandable_optional                # the user chose: no silent fallback
    assert resolve_with_policy({}, policy="amem-reclaim", env={"AMEM_POLICY": "torch"}).policy == "amem-reclaim"
    with pytest.raises(ValueError, match="AMEM_POLICY: unknown policy 'fast'"):
        resolve_with_policy({}, env={"AMEM_POLICY": "fast"})


def test_a_cpu_allocator_starts_from_torchs_policy_or_the_one_it_is_given():
    import amem_alloc

    assert "expandable_segments:False" in amem_alloc.Allocator("sim").settings
    settings = amem_alloc.Allocator("sim", policy="amem", large_page_mb=4).settings
    assert "expandable_segments:True" in settings and "cross_stream_reuse:handover" in settings
    assert "large_page_mb:4" in settings
    with pytest.raises(ValueError, match="unknown policy 'zzz'"):
        amem_alloc.Allocator("sim", policy="zzz")


def test_enabled_allocator_runs_amems_policy_unless_told_otherwise():
    probe = """
        import amem_alloc
        amem_alloc.enable()
        print(amem_alloc._C.cuda_settings())
    """
    assert "expandable_segments:True" in run_python(probe).stdout
    assert "expandable_segments:False" in run_python(probe, env={"AMEM_POLICY": "amem-defaults"}).stdout


def test_a_bad_amem_policy_stops_autoenable_with_one_line():
    proc = run_python("print('ran')", env={"AMEM_ENABLE": "1", "AMEM_POLICY": "fastest"})
    assert proc.returncode == 1 and "ran" not in proc.stdout
    assert "unknown policy 'fastest'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(not hasattr(__import__("amem_alloc")._C, "registry_use_backend"), reason="no registry_use_backend")
def test_the_policys_expandable_segments_are_used_where_the_device_can_map_pages():
    """Through torch's entry point on a device that maps pages (host memory), the default policy's
    expandable segments are in place and nothing is said; a device that cannot map pages gets plain
    segments and one line (tests/cpp/registry_test.cpp, on the fake CUDA)."""
    proc = run_python("""
        import ctypes, amem_alloc
        from amem_alloc import _C
        _C.registry_use_backend("host", 64 << 20)
        amem_alloc.enable()
        lib = ctypes.CDLL(_C.__file__)
        lib.amem_malloc.restype = ctypes.c_void_p
        lib.amem_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        p = lib.amem_malloc(3 << 20, 0, None)
        print("expandable:", [s.is_expandable for s in amem_alloc.segments(0)])
    """)
    assert proc.returncode == 0, proc.stderr
    assert "expandable: [True]" in proc.stdout and "plain segments" not in proc.stderr


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
