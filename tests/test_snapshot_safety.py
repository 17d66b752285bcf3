"""Bad input: truncated, corrupt and hostile pickles, wrong shapes, unknown versions, empty traces.
Each gives SnapshotError (a ValueError naming the file and the problem) — never another exception,
never code execution — and whatever loads can be reported and exported."""
import os
import pickle
import random
from pathlib import Path

import pytest

from amem_alloc import Allocator, SnapshotError, load_snapshot
from amem_alloc.trace_export import chrome_trace, rmm_csv
from amem_alloc.report import render_report
from amem_alloc.snapshot import FORMAT_VERSION, parse_snapshot

from test_snapshot import TRACES


def write(tmp_path, raw: bytes, name="x.pickle") -> Path:
    path = tmp_path / name
    path.write_bytes(raw)
    return path


def our_dump() -> bytes:
    a = Allocator(backend="sim")
    a.record()
    p = a.malloc(3 << 20)
    a.malloc(1000, stream=2)
    a.free(p)
    a.empty_cache()
    return pickle.dumps(a.snapshot(), protocol=4)


# ============================================================================ hostile pickles
class _RunsCode:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_hostile_pickle_is_refused_without_running(tmp_path):
    marker = tmp_path / "pwned"
    raw = pickle.dumps({"segments": [], "device_traces": [], "x": _RunsCode(marker)}, protocol=4)
    with pytest.raises(SnapshotError, match=r"refused to load (posix|os)\.system"):
        load_snapshot(write(tmp_path, raw))
    assert not marker.exists()


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_every_class_lookup_is_refused(tmp_path, protocol):
    for obj in (eval, {"segments": [], "device_traces": [], "s": {1, 2} if protocol < 2 else range(3)},
                {"segments": [], "f": Path("/")}):
        with pytest.raises(SnapshotError, match="refused to load"):
            load_snapshot(write(tmp_path, pickle.dumps(obj, protocol=protocol)))


def test_extension_registry_is_refused_too(tmp_path):
    """EXT opcodes name a class through copyreg's registry: still a class lookup, still refused."""
    import copyreg

    raw = b"\x80\x02\x82\xab."  # EXT1 0xab: the object registered under code 0xab
    copyreg.add_extension(os.system.__module__, "system", 0xAB)
    try:
        with pytest.raises(SnapshotError, match="refused to load"):
            load_snapshot(write(tmp_path, raw))
    finally:
        copyreg.remove_extension(os.system.__module__, "system", 0xAB)


# ============================================================================ broken files
@pytest.mark.parametrize("raw, words", [
    (b"", "empty"),
    (b"not a pickle at all", "not a pickle"),
    (b'{"segments": []}', "not a pickle"),
    (b"\x80\x04\x95\xff\xff\xff\x00\x00\x00\x00", "truncated"),
    (pickle.dumps([1, 2, 3], protocol=4), "must be a dict"),
    (pickle.dumps("hello", protocol=4), "must be a dict"),
    (pickle.dumps({"device_traces": []}, protocol=4), "no 'segments' key"),
    (pickle.dumps({"segments": {}}, protocol=4), "segments must be a list"),
    (pickle.dumps({"segments": [{"address": 0}]}, protocol=4), "missing key 'total_size'"),
    (pickle.dumps({"segments": [{"address": "0", "total_size": 1}]}, protocol=4), "'address' must be an integer"),
    (pickle.dumps({"segments": [], "device_traces": [[{"action": 3}]]}, protocol=4), "'action' must be a string"),
    (pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "size": -1}]]}, protocol=4), "out of range"),
    (pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "time_us": float("nan")}]]}, protocol=4),
     "finite"),
    (pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "frames": "x"}]]}, protocol=4),
     "frames must be a list"),
    (pickle.dumps({"segments": [], "amem": {"version": FORMAT_VERSION + 1}}, protocol=4), "newer than this amem"),
    (pickle.dumps({"segments": [], "amem": {"version": "1"}}, protocol=4), "bad format version"),
])
def test_broken_files_give_a_clear_error(tmp_path, raw, words):
    path = write(tmp_path, raw)
    with pytest.raises(SnapshotError) as err:
        load_snapshot(path)
    assert str(path) in str(err.value) and words in str(err.value)


def test_truncated_real_snapshot_says_truncated(tmp_path):
    raw = our_dump()
    for cut in (1, 2, len(raw) // 3, len(raw) - 1):
        with pytest.raises(SnapshotError, match="truncated"):
            load_snapshot(write(tmp_path, raw[:cut]))


def test_misaligned_amem_columns_are_refused(tmp_path):
    data = pickle.loads(our_dump())
    data["amem"]["devices"][0]["columns"]["tag"].append(0)
    with pytest.raises(SnapshotError, match="one integer per trace entry"):
        parse_snapshot(data, "x")


def test_a_directory_is_a_clear_error(tmp_path):
    with pytest.raises(SnapshotError, match="cannot read"):
        load_snapshot(tmp_path)


def test_shared_frame_lists_are_checked_once_and_counted_at_each_use(tmp_path):
    """A small file can reference one long list a million times: checking must not multiply, and
    what readers would walk (every use of a shared stack) is bounded by the file's size."""
    frames = [{"filename": "f.py", "line": 1, "name": "g"}] * 500
    events = [{"action": "alloc", "addr": 512 * i, "size": 512, "stream": 0, "frames": frames} for i in range(2000)]
    data = load_snapshot(write(tmp_path, pickle.dumps({"segments": [], "device_traces": [events]}, protocol=4)))
    render_report(data)  # 1M references in all: within the budget, and shown
    frames = frames * 40
    events = [dict(ev, frames=frames) for ev in events]  # 40M references from a 100 KB file
    path = write(tmp_path, pickle.dumps({"segments": [], "device_traces": [events]}, protocol=4), "big.pickle")
    assert path.stat().st_size < 200_000
    with pytest.raises(SnapshotError, match=r"reference more than \d,\d{3},\d{3} frame entries .*32 per byte"):
        load_snapshot(path)


# ============================================================================ empty and odd traces
def test_empty_snapshot_loads_and_reports_nothing_recorded(tmp_path):
    data = load_snapshot(write(tmp_path, pickle.dumps({"segments": [], "device_traces": []}, protocol=4)))
    page = render_report(data)
    assert "Nothing recorded" in page
    assert chrome_trace(data)["traceEvents"] == []
    assert rmm_csv(data).strip() == "Thread,Time,Action,Pointer,Size,Stream"


def test_trace_with_only_frees_starts_mid_run_and_never_goes_negative():
    events = [{"action": a, "addr": 4096 * k, "size": 1000, "stream": 0, "time_us": 10 * k + j, "frames": []}
              for k in range(5) for j, a in enumerate(("free_requested", "free_completed"))]
    data = parse_snapshot({"segments": [], "device_traces": [events]})
    page = render_report(data)
    assert "starts mid-run" in page
    from amem_alloc.timeline import build_timeline

    tl = build_timeline(data, 0)
    assert tl.allocated[0] == 5 * 1024 and tl.allocated[-1] == 0 and min(tl.allocated) >= 0
    csv = rmm_csv(data).splitlines()  # replay needs an allocate before each free: one at the start
    assert csv[1:6] == [f"0,00:00:00.000000,allocate,{4096 * k:#x},1000,0" for k in range(5)]
    assert [r.split(",")[2] for r in csv[6:]] == ["free"] * 5


# ============================================================================ fuzzing
def _mutations(raw: bytes, rng: random.Random, n: int):
    for _ in range(n):
        kind = rng.randrange(4)
        b = bytearray(raw)
        if kind == 0:
            b = b[:rng.randrange(len(b))]
        elif kind == 1:
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        elif kind == 2:
            at = rng.randrange(len(b))
            b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 6)))
        else:
            at = rng.randrange(len(b))
            del b[at:at + rng.randint(1, 16)]
        yield bytes(b)


def _fuzz_sources() -> list[bytes]:
    sources = [our_dump()]
    tiny = [p for p in TRACES if p.name == "tiny_grad.pickle"]
    if tiny:
        sources.append(tiny[0].read_bytes())
    return sources


ODD_VALUES = [None, -1, 0, 2 ** 70, -(2 ** 70), "x", "", [], {}, 1.5, float("inf"), True, (1, 2),
              {"filename": 3}, [[[[[]]]]], b"bytes", {1, 2}, "<script>alert(1)</script>"]


def _slots(data, rng: random.Random, limit: int = 4000) -> list:
    """Up to `limit` (container, key) places in a snapshot, sampled as the structure is walked."""
    out, stack = [], [data]
    while stack and len(out) < limit:
        node = stack.pop(rng.randrange(len(stack)))
        keys = list(node) if isinstance(node, dict) else range(len(node)) if isinstance(node, list) else []
        for k in keys:
            out.append((node, k))
            if isinstance(node[k], (dict, list)):
                stack.append(node[k])
    return out


def _object_mutations(raw: bytes, rng: random.Random, n: int):
    """Snapshots that unpickle fine but hold a wrong type, a missing key or an odd value somewhere."""
    for _ in range(n):
        data = pickle.loads(raw)
        for _ in range(rng.randint(1, 3)):
            slots = _slots(data, rng)
            if not slots:
                break
            node, key = rng.choice(slots)
            if isinstance(node, dict) and rng.random() < 0.25:
                del node[key]
            else:
                node[key] = rng.choice(ODD_VALUES)
        yield pickle.dumps(data, protocol=4)


def _check_outcome(path: Path, outcomes: dict) -> None:
    try:
        data = load_snapshot(path)
    except SnapshotError:
        outcomes["error"] += 1
        return
    outcomes["loaded"] += 1
    page = render_report(data)  # whatever loads can be shown and exported
    assert "<script>alert" not in page
    chrome_trace(data)
    try:
        rmm_csv(data)
    except ValueError as err:  # several devices with events: the caller must choose one
        assert "choose one" in str(err)


@pytest.mark.parametrize("source", range(len(_fuzz_sources())))
@pytest.mark.parametrize("level", ["bytes", "objects"])
def test_fuzzed_snapshots_give_snapshot_error_or_a_usable_snapshot(tmp_path, source, level):
    """Seeded: 200 variants each of our dump and of a real torch snapshot, mutated as bytes
    (truncated, flipped, inserted, deleted) or as objects (wrong types, missing keys, odd values)."""
    raw = _fuzz_sources()[source]
    rng = random.Random(f"{level}-{source}")
    mutate = _mutations if level == "bytes" else _object_mutations
    outcomes = {"error": 0, "loaded": 0}
    for i, mutated in enumerate(mutate(raw, rng, 200)):
        _check_outcome(write(tmp_path, mutated, f"m{i}.pickle"), outcomes)
    assert outcomes["error"] > 0 and outcomes["loaded"] > 0, outcomes
