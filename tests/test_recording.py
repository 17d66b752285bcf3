"""record(), Python stacks, tags, and always-on mode (AMEM_TRACE): on a CPU through the host and sim
backends, by calling the registered out-of-memory callback, and in child processes through
enable() — with the CUDA registry on the host backend where the build offers that."""
import json
from pathlib import Path

import pytest

import amem_alloc
from amem_alloc import Allocator, load_snapshot, recording
from amem_alloc.report import render_report

from helpers import run_python


def events(a):
    return json.loads(a._core.trace_json())["events"]


# ============================================================================ record()
def test_record_validates_its_arguments():
    a = Allocator(backend="sim")
    with pytest.raises(ValueError, match="stacks must be None or 'python'"):
        amem_alloc.record(stacks="cpp", allocator=a)
    with pytest.raises(ValueError, match="max_entries"):
        amem_alloc.record(max_entries=0, allocator=a)
    with pytest.raises(TypeError, match="max_entries"):
        amem_alloc.record(max_entries=1.5, allocator=a)
    assert not recording.is_recording(a)


def test_record_starts_and_stops():
    a = Allocator(backend="sim")
    a.record()
    assert recording.is_recording(a)
    p = a.malloc(1000)
    a.record(False)
    a.free(p)
    assert [e["action"] for e in events(a)] == ["segment_alloc", "alloc"]


def _alloc_twice(a):
    return [a.malloc(1000) for _ in range(2)]  # one line: one stack


def test_identical_stacks_share_one_id_and_frames_are_innermost_first():
    a = Allocator(backend="sim")
    a.record(stacks="python")
    _alloc_twice(a)
    a.malloc(2000)
    a.record(False)
    contexts = [e["context"] for e in events(a) if e["action"] == "alloc"]
    assert contexts[0] == contexts[1] != contexts[2] and 0 not in contexts
    frames = recording.frames_for(contexts[0])
    names = [f["name"] for f in frames]
    assert names.index("_alloc_twice") < names.index("test_identical_stacks_share_one_id_and_frames_are_innermost_first")
    assert not any("amem_alloc" in Path(f["filename"]).parts for f in frames)  # allocator.py etc. trimmed
    assert recording.frames_for(0) == [] and recording.frames_for(10 ** 9) == []


@pytest.fixture()
def no_stack_users(monkeypatch):
    """Stack capture is process-wide: start from a process where no recorder asks for it."""
    before = recording._state["stack_users"]
    monkeypatch.setitem(recording._state, "stack_users", set())
    amem_alloc._C.set_stack_capturer(None)
    yield
    amem_alloc._C.set_stack_capturer(recording.capture_stack if before else None)


def test_without_stacks_contexts_are_zero(no_stack_users):
    a = Allocator(backend="sim")
    a.record()
    a.malloc(1000)
    assert {e["context"] for e in events(a)} == {0}


def test_stopping_one_recorder_keeps_anothers_stacks(no_stack_users):
    a, b = Allocator(backend="sim"), Allocator(backend="sim")
    a.record(stacks="python")
    b.record(stacks="python")
    b.record(False)
    a.malloc(1000)
    assert all(e["context"] for e in events(a))
    a.record(False)
    assert not recording._state["stack_users"]


def test_a_dropped_allocator_stops_asking_for_stacks(no_stack_users):
    import gc

    a = Allocator(backend="sim")
    a.record(stacks="python")
    assert recording._state["stack_users"]
    del a
    gc.collect()
    assert not recording._state["stack_users"]


def test_tags_nest_and_restore():
    a = Allocator(backend="sim")
    a.record()
    with amem_alloc.tag("forward") as fwd:
        a.malloc(1000)
        with amem_alloc.tag("attention") as att:
            a.malloc(1000)
        a.malloc(1000)
    a.malloc(1000)
    with pytest.raises(RuntimeError), amem_alloc.tag("forward") as again:
        raise RuntimeError("inside a tag")
    assert amem_alloc._C.trace_tag() == 0 and again == fwd != att
    tags = [e["tag"] for e in events(a) if e["action"] == "alloc"]
    assert tags == [fwd, att, fwd, 0]
    assert recording.tag_name(fwd) == "forward" and recording.tag_names()[att] == "attention"
    with pytest.raises(ValueError):
        with amem_alloc.tag(""):
            pass


def test_ring_overflow_is_counted_and_reported():
    a = Allocator(backend="sim")
    a.record(max_entries=5)
    for _ in range(10):
        a.free(a.malloc(1000))
    snap = a.snapshot()
    assert snap["amem"]["devices"][0]["dropped"] == 1 + 3 * 10 - 5  # segment_alloc, then alloc/free_requested/free_completed x 10
    assert len(snap["device_traces"][0]) == 5
    assert "The recording ring overflowed" in render_report(load_snapshot_from(snap))


def load_snapshot_from(snap):
    from amem_alloc.snapshot import parse_snapshot

    return parse_snapshot(snap)


# ============================================================================ always-on mode
def test_oom_path_inserts_oom_before_the_suffix():
    assert recording.oom_path("/x/trace.pickle") == Path("/x/trace.oom.pickle")
    assert recording.oom_path("trace") == Path("trace.oom")


def test_trace_config_from_env():
    assert recording.trace_config_from_env({}) is None
    assert recording.trace_config_from_env({"AMEM_TRACE": "t.pickle"}) == {
        "path": "t.pickle", "stacks": None, "max_entries": recording.DEFAULT_MAX_ENTRIES, "flush_seconds": None}
    assert recording.trace_config_from_env({"AMEM_TRACE": "t", "AMEM_TRACE_STACKS": "python",
                                            "AMEM_TRACE_ENTRIES": "64"})["max_entries"] == 64
    with pytest.raises(ValueError, match="AMEM_TRACE_STACKS"):
        recording.trace_config_from_env({"AMEM_TRACE": "t", "AMEM_TRACE_STACKS": "c++"})
    with pytest.raises(ValueError, match="AMEM_TRACE_ENTRIES"):
        recording.trace_config_from_env({"AMEM_TRACE": "t", "AMEM_TRACE_ENTRIES": "lots"})


def test_always_on_dumps_on_oom_and_at_exit_host_backend(tmp_path):
    path = tmp_path / "trace.pickle"
    a = Allocator(backend="host", limit_bytes=32 << 20)
    recording.start_always_on(path, stacks="python", allocator=a)
    try:
        keep = a.malloc(8 << 20)
        with pytest.raises(amem_alloc.OutOfMemoryError):
            a.malloc(64 << 20)
        recording._always_on["on_oom"](0)  # what the CUDA entry point calls before torch raises
        oom = load_snapshot(recording.oom_path(path))
        trace = oom["device_traces"][0]
        assert trace[-1]["action"] == "oom" and trace[-1]["size"] == 64 << 20
        assert trace[-1]["frames"]  # the stack of the failing request
        a.free(keep)
        recording._at_exit()  # what atexit runs
        final = load_snapshot(path)
        assert [e["action"] for e in final["device_traces"][0]][-2:] == ["free_requested", "free_completed"]
    finally:
        recording.stop_always_on()
        recording.stop(a)
    assert recording.always_on_path() is None


def test_a_failing_dump_is_reported_not_raised(tmp_path, capsys):
    a = Allocator(backend="sim")
    blocker = tmp_path / "file"
    blocker.write_text("")
    recording.start_always_on(blocker / "trace.pickle", allocator=a)  # a directory that cannot exist
    try:
        recording._always_on["on_oom"](0)
        recording._at_exit()
    finally:
        recording.stop_always_on()
        recording.stop(a)
    err = capsys.readouterr().err
    assert "could not write the trace at the out-of-memory error" in err and "at exit" in err


def test_amem_trace_env_starts_recording_in_enable_and_dumps_at_exit(tmp_path):
    path = tmp_path / "t.pickle"
    proc = run_python("""
        import amem_alloc
        from amem_alloc import recording
        amem_alloc.enable()
        print("recording", recording.is_recording(), recording.always_on_path())
    """, env={"AMEM_TRACE": str(path)})
    assert proc.returncode == 0, proc.stderr
    assert f"recording True {path}" in proc.stdout
    data = load_snapshot(path)  # no GPU here: no device used, an empty but valid snapshot
    assert data["amem"]["backend"] == "cuda" and data["segments"] == []
    assert "Nothing recorded" in render_report(data)


def test_amem_enable_with_amem_trace_records_from_startup(tmp_path):
    path = tmp_path / "t.pickle"
    proc = run_python("from amem_alloc import recording; print('path', recording.always_on_path())",
                      env={"AMEM_ENABLE": "1", "AMEM_TRACE": str(path)})
    assert f"path {path}" in proc.stdout, proc.stderr
    assert path.exists()


def test_bad_amem_trace_setting_fails_before_installing_anything(tmp_path):
    proc = run_python("""
        import amem_alloc
        try:
            amem_alloc.enable()
        except ValueError as err:
            print("refused:", err)
        print("enabled:", amem_alloc.is_enabled())
    """, env={"AMEM_TRACE": str(tmp_path / "t.pickle"), "AMEM_TRACE_ENTRIES": "-3"})
    assert "refused: AMEM_TRACE_ENTRIES" in proc.stdout and "enabled: False" in proc.stdout


CRASH = """
import ctypes, sys
import amem_alloc
from amem_alloc import _C
_C.registry_use_backend("host", 64 << 20)   # the CUDA registry, on host memory
amem_alloc.enable()                          # AMEM_TRACE: always-on mode
lib = ctypes.CDLL(_C.__file__)
lib.amem_malloc.restype = ctypes.c_void_p
lib.amem_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]

def step():
    return lib.amem_malloc(4 << 20, 0, None)

keep = step()
print("allocated", hex(keep), flush=True)
lib.amem_malloc(1 << 30, 0, None)            # out of memory: the error cannot cross ctypes, the process dies
print("not reached")
"""


@pytest.mark.skipif(not hasattr(amem_alloc._C, "registry_use_backend"), reason="this build has no registry_use_backend")
def test_the_oom_trace_survives_the_crash(tmp_path):
    """torch's entry point amem_malloc, out of memory: the callback writes trace.oom.pickle before the
    error leaves; here the error then kills the process (it cannot cross ctypes), as a crash would."""
    path = tmp_path / "trace.pickle"
    proc = run_python(CRASH, env={"AMEM_TRACE": str(path), "AMEM_TRACE_STACKS": "python"})
    assert "allocated" in proc.stdout and "not reached" not in proc.stdout
    assert proc.returncode != 0  # the crash; no atexit dump
    assert not path.exists()
    data = load_snapshot(recording.oom_path(path))
    trace = data["device_traces"][0]
    assert [e["action"] for e in trace] == ["segment_map", "alloc", "oom"]  # amem's policy: pages mapped
    assert trace[-1]["size"] == 1 << 30 and trace[-1]["device_free"] > 0
    assert "step" in [f["name"] for f in trace[1]["frames"]]  # python stacks through the C entry point
    assert "out of memory" in render_report(data).lower()


def test_python_m_amem_alloc_is_importable_without_torch_for_reports():
    proc = run_python("""
        import sys
        import amem_alloc.report, amem_alloc.trace_export, amem_alloc.snapshot, amem_alloc.recording
        print("torch loaded:", "torch" in sys.modules)
    """)
    assert proc.returncode == 0, proc.stderr
    assert "torch loaded: False" in proc.stdout
