"""torch.cuda under prediction: scripts' calls answer from the chosen card and from the predicted
allocations (fed to the sim core as they happen), and everything is put back on exit.

The engine is replaced by a test double (tests/predict_double.py) that allocates exactly what the
test says, so every figure below is known in advance."""
import pickle

import pytest

torch = pytest.importorskip("torch")

import amem_alloc  # noqa: E402
from amem_alloc.predict import gpus  # noqa: E402
from amem_alloc.predict.shims import devices  # noqa: E402
from amem_alloc.snapshot import load_snapshot  # noqa: E402
from predict_double import DoubleSession  # noqa: E402

MiB = 1 << 20
ORIGINALS = {n: getattr(torch.cuda, n) for n in ("is_available", "memory_allocated", "Stream", "synchronize")}
DUMP = torch.cuda.memory._dump_snapshot


def _run(body, gpu="A100-40GB", **kw):
    with amem_alloc.predicting(gpu, session_factory=DoubleSession, **kw) as run:
        body(DoubleSession.last)
    return run


def test_device_questions_answer_from_the_chosen_card():
    seen = {}

    def body(s):
        seen["available"] = torch.cuda.is_available()
        seen["count"] = torch.cuda.device_count()
        seen["props"] = torch.cuda.get_device_properties(0)
        seen["name"] = torch.cuda.get_device_name()
        seen["cap"] = torch.cuda.get_device_capability("cuda:0")
        seen["bf16"] = torch.cuda.is_bf16_supported()
        torch.cuda.set_device(0)
        seen["current"] = torch.cuda.current_device()
        torch.cuda.synchronize()
        torch.cuda.manual_seed(1)
        torch.cuda.manual_seed_all(1)
        with pytest.raises(AssertionError, match="Invalid device id 1"):
            torch.cuda.get_device_properties(1)
        torch.cuda.set_per_process_memory_fraction(0.5)
        with pytest.raises(ValueError, match="Invalid fraction"):
            torch.cuda.set_per_process_memory_fraction(1.5)
        free, total = torch.cuda.mem_get_info()
        seen["free"], seen["total"] = free, total

    _run(body)
    card = gpus.get("A100-40GB")
    assert seen["available"] is True and seen["count"] == 1 and seen["current"] == 0
    assert seen["props"].total_memory == card.total_memory == 40536 * MiB
    assert seen["props"].name == seen["name"] == "NVIDIA A100-SXM4-40GB"
    assert (seen["props"].major, seen["props"].minor) == seen["cap"] == (8, 0) and seen["bf16"]
    assert seen["total"] == card.total_memory and seen["free"] == card.total_memory - card.context


def test_memory_figures_follow_the_predicted_allocations():
    seen = []

    def body(s):
        def snap():
            seen.append((torch.cuda.memory_allocated(), torch.cuda.memory_reserved(),
                         torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()))

        a = s.alloc(3 * MiB)            # a large request: a 20 MiB segment, as torch makes it
        b = s.alloc(1000)               # small: 512 B rounding, a 2 MiB segment
        snap()
        s.free(a)
        snap()                          # freed, still cached
        torch.cuda.empty_cache()
        snap()                          # the large segment went back
        torch.cuda.reset_peak_memory_stats()
        snap()
        stats = torch.cuda.memory_stats()
        assert stats["allocated_bytes.all.current"] == torch.cuda.memory_allocated() == 1024
        assert "reserved_bytes.all.peak" in stats and "predict" in torch.cuda.memory_summary()
        s.free(b)

    run = _run(body)
    assert seen == [(3 * MiB + 1024, 22 * MiB, 3 * MiB + 1024, 22 * MiB),
                    (1024, 22 * MiB, 3 * MiB + 1024, 22 * MiB),
                    (1024, 2 * MiB, 3 * MiB + 1024, 22 * MiB),
                    (1024, 2 * MiB, 1024, 2 * MiB)]
    # the program has the release where the script emptied the cache
    assert [op[0] for op in run.recording.ops] == [0, 0, 1, 2, 1]


def test_streams_and_events_keep_identity_and_do_nothing():
    seen = {}

    def body(s):
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream(priority=-1)
        seen["distinct"] = s1 != s2 and s1 == s1 and s1.cuda_stream != 0
        seen["default"] = torch.cuda.current_stream() == torch.cuda.default_stream()
        with torch.cuda.stream(s1):
            seen["inside"] = torch.cuda.current_stream() == s1
            with torch.cuda.stream(s2):
                seen["nested"] = torch.cuda.current_stream() == s2
            seen["back"] = torch.cuda.current_stream() == s1
        seen["after"] = torch.cuda.current_stream().cuda_stream == 0
        s2.wait_stream(s1)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        end.record(s1)
        end.synchronize()
        seen["elapsed"] = start.elapsed_time(end)
        seen["query"] = s1.query() and end.query()

    _run(body)
    assert all(seen[k] for k in ("distinct", "default", "inside", "nested", "back", "after", "query"))
    assert seen["elapsed"] > 0   # a rate computed from it is finite (a stand-in, noted below)


def test_a_rate_from_event_timing_is_finite_and_its_time_a_noted_stand_in():
    """A throughput computed from Event.elapsed_time divided by zero (the script's ZeroDivisionError,
    read as its failure); the time is a positive stand-in, noted."""
    def body():
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.randn(64, 64, device="cuda")
        end.record()
        torch.cuda.synchronize()
        print(64 / (start.elapsed_time(end) / 1000), "rows/s")

    result = amem_alloc.predict(body, gpu="H100", policies=["torch"])
    assert [note["what"] for note in result.notes if note["what"].startswith("Event.")] == [devices.ELAPSED_NOTE]


def test_dump_snapshot_writes_the_record_window_with_user_frames(tmp_path):
    path = tmp_path / "mid.pickle"

    def body(s):
        s.alloc(5 * MiB, "parameter", module="lin")                 # before recording: state only
        torch.cuda.memory._record_memory_history(max_entries=1000)
        k = s.alloc(7 * MiB, "activation", module="lin", op="aten::mm", frames=(("train.py", 12, "step"),))
        s.free(k)
        torch.cuda.memory._dump_snapshot(str(path))
        torch.cuda.memory._record_memory_history(enabled=None)

    _run(body)
    snap = load_snapshot(path)
    trace = snap["device_traces"][0]
    allocs = [e for e in trace if e["action"] == "alloc"]
    assert [e["size"] for e in allocs] == [7 * MiB]                 # only what the window saw
    assert allocs[0]["frames"] == [{"filename": "train.py", "line": 12, "name": "step"}]
    assert "activation" in allocs[0]["user_metadata"]
    active = [b for seg in snap["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"]
    assert [b["requested_size"] for b in active] == [5 * MiB]       # the earlier parameter is still live
    assert "prediction" in snap["allocator_settings"]
    with open(path, "rb") as f:                                     # torch's own reader: a plain pickle
        assert pickle.load(f)["device_traces"][0] == trace


def test_everything_is_restored_even_on_error():
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with amem_alloc.predicting(session_factory=DoubleSession) as run:
            assert torch.cuda.is_available()
            raise Boom("the user's own error")
    assert run.result is None and DoubleSession.last.exited
    for name, fn in ORIGINALS.items():
        assert getattr(torch.cuda, name) is fn
    assert torch.cuda.memory._dump_snapshot is DUMP and not hasattr(torch.cuda, "_dump_snapshot")
    assert not torch.cuda.is_available()


def test_raw_bytes_from_the_caching_allocator_are_allocations():
    """torch.cuda.caching_allocator_alloc/delete (CuPy's bridge to torch's allocator, extensions):
    a block of the bytes asked for, at a device address, until deleted; an address it did not
    give is refused as torch refuses it (the script's error)."""
    seen = []

    def body():
        first = torch.cuda.caching_allocator_alloc(64 * MiB)
        second = torch.cuda.memory.caching_allocator_alloc(32 * MiB, 0, torch.cuda.current_stream())
        seen.append((first != second, torch.cuda.memory_allocated()))
        torch.cuda.caching_allocator_delete(first)
        seen.append(torch.cuda.memory_allocated())
        torch.cuda.caching_allocator_delete(second)
        with pytest.raises(RuntimeError, match="invalid device pointer"):
            torch.cuda.caching_allocator_delete(second)

    result = amem_alloc.predict(body, gpu="H100", policies=["torch"])
    assert seen == [(True, 96 * MiB), 32 * MiB]
    assert result.rows[0].peak_allocated == 96 * MiB


@pytest.mark.parametrize("activities", ["cpu+cuda", "cuda"])
def test_the_profilers_cuda_activity_is_off_as_torch_turns_it_off_without_cuda(capfd, activities):
    """torch.profiler asked for CUDA activity: off, as torch does where CUDA is not available, and
    noted (with it on, torch recorded a CUDA event per op, each failing with a C++ warning and its
    stack); the CPU's events are profiled instead, also where only CUDA's were asked for."""
    from torch.profiler import ProfilerActivity, profile

    asked = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if activities == "cpu+cuda" else [])
    names = []

    def body():
        with profile(activities=asked) as prof:
            torch.randn(64, 64, device="cuda").relu()
        names.extend(event.key for event in prof.key_averages())

    result = amem_alloc.predict(body, gpu="H100", policies=["torch"])
    assert "Failed to record CUDA event" not in capfd.readouterr().err
    assert any("profiler: CUDA activity off" in str(note) for note in result.notes)
    assert "aten::relu" in names


def test_an_external_profilers_capture_range_returns_at_once():
    """torch.cuda.profiler.start/stop and its profile() context (nsys's cudaProfilerApi capture
    range) asked the driver and stopped the prediction; they return at once, noted."""
    def body():
        torch.cuda.profiler.start()
        torch.randn(8, device="cuda")
        torch.cuda.profiler.stop()
        with torch.cuda.profiler.profile():
            torch.randn(8, device="cuda")

    result = amem_alloc.predict(body, gpu="H100", policies=["torch"])
    said = [note["what"].split(":")[0] for note in result.notes if "torch.cuda.profiler" in note["what"]]
    assert said == ["torch.cuda.profiler.start()", "torch.cuda.profiler.stop()"] * 2


def test_a_tensor_prints_the_device_it_claims():
    """A rank's tensors are on its own device (torch.cuda.set_device(LOCAL_RANK)): their printed form
    said cuda:0 on every rank (Megatron's loss printed from rank 1)."""
    with amem_alloc.predicting("H100", device_count=2, analyse=False):
        torch.cuda.set_device(1)
        x = torch.ones((), device="cuda")
        assert x.device == torch.device("cuda", 1)
        assert "device='cuda:1'" in repr(x * 2), repr(x * 2)
        torch.cuda.set_device(0)
