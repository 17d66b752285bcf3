"""Untrusted traces are loaded in bounded time and memory (amem_alloc/snapshot/load.py): hostile
pickles (a memo bomb, shared references, deep nesting, huge and negative numbers), devices, pipes
and oversized files are refused in one line naming the file, what was wrong and the limit, before
they cost more than a small multiple of their size; standard input (`-`) is read within the cap."""
import os
import pickle
import subprocess
import sys
import textwrap
import time

import pytest

from amem_alloc import SnapshotError, _C, cli, load_snapshot
from amem_alloc.snapshot import load as load_mod

from helpers import ROOT, shared_traces_dir

TRACE = shared_traces_dir() / "small_train.pickle"
needs_trace = pytest.mark.skipif(not TRACE.exists(), reason="../shared/traces is not present")
MEMO_BOMB = b"\x80\x04]r\x00\x00\x00\x10."  # an empty list stored under memo index 2^28: 9 bytes, 4 GB


def write(tmp_path, raw: bytes, name="x.pickle"):
    path = tmp_path / name
    path.write_bytes(raw)
    return path


def dumps(obj) -> bytes:
    return pickle.dumps(obj, protocol=4)


def event(i=0, **fields):
    return {"action": "alloc", "addr": 512 * i, "size": 512, "stream": 0, "time_us": i, "frames": [], **fields}


def refused(path, *words, seconds=2.0):
    started = time.perf_counter()
    with pytest.raises(SnapshotError) as err:
        load_snapshot(path)
    assert time.perf_counter() - started < seconds
    text = str(err.value)
    assert "\n" not in text and text.startswith(str(path) if path != "-" else "standard input"), text
    for word in words:
        assert word in text, text
    return text


# ---------------------------------------------------------------------------- the opcode scan
def test_a_memo_bomb_is_refused_before_unpickling(tmp_path):
    text = refused(write(tmp_path, MEMO_BOMB), "hostile pickle", "memo index 268435456", "limits:")
    assert "not a snapshot that torch or amem wrote" in text


def test_the_memo_bomb_costs_neither_time_nor_memory(tmp_path):
    """In a process of its own, so its peak memory is its own: once 4.2 GB and 11 s, now nothing."""
    path = write(tmp_path, MEMO_BOMB)
    code = textwrap.dedent(f"""
        import resource, time
        from amem_alloc import SnapshotError, load_snapshot
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.perf_counter()
        try:
            load_snapshot({str(path)!r})
        except SnapshotError:
            pass
        print(time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    seconds, grown_kib = map(float, proc.stdout.split())
    assert seconds < 1 and grown_kib < 50_000, proc.stdout


@pytest.mark.parametrize("raw, words", [
    (b"\x80\x02]r\x05\x00\x00\x00.", "memo index 5"),        # LONG_BINPUT past the stored count
    (b"(lp99999999\n.", "memo index 99999999"),             # protocol 0's PUT
    (b"(" * 1001 + b".", "more than 1000 marks"),           # nesting by marks
])
def test_scan_limits_are_refused(tmp_path, raw, words):
    refused(write(tmp_path, raw), "hostile pickle", words)


def test_deep_nesting_past_the_stack_limit_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(load_mod, "MAX_STACK", 10_000)
    raw = b"\x80\x04" + b"]" * 20_000 + b"a" * 19_999 + b"."  # a list nested 20,000 deep
    refused(write(tmp_path, raw), "more than 10000 values on the unpickler's stack")


def test_deep_nesting_within_the_limits_loads_and_reports(tmp_path):
    """A frame entry nested 50,000 deep (the C unpickler builds it without recursion): readers
    never recurse into frame entries, so it is shown, not a RecursionError."""
    deep = b"]" * 50_000 + b"a" * 49_999
    raw = (b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces]]}(\x8c\x06action\x8c\x05alloc"
           b"\x8c\x06frames](" + deep + b"eu" + b"aau.")
    data = load_snapshot(write(tmp_path, raw))
    from amem_alloc.trace_export import chrome_trace
    from amem_alloc.report import render_report

    render_report(data)
    chrome_trace(data)


def test_every_real_trace_passes_the_scan():
    for path in sorted(shared_traces_dir().glob("*.pickle")):
        scan = _C.scan_pickle(path.read_bytes(), 1000, 1 << 20, 1 << 20)
        assert scan["parsed"] and not scan["refused"], (path.name, scan)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_the_scan_reads_every_protocol(protocol):
    obj = {"a": [1, 300, 70000, 2 ** 70, -5, 2.5, "x", "é" * 300, b"y", bytearray(b"z"), None, True, False,
                 (), (1,), (1, 2), (1, 2, 3), tuple(range(9)), {1, 2}, frozenset([3]), [[]] * 3, {"k": {}}]}
    obj["shared"] = obj["a"]
    scan = _C.scan_pickle(pickle.dumps(obj, protocol=protocol), 1000, 1 << 20, 1 << 20)
    assert scan["parsed"] and not scan["refused"] and scan["memo_gets"] >= 1, scan


# ---------------------------------------------------------------------------- shared references
def test_one_segment_referenced_3000_times_is_refused(tmp_path):
    seg = {"address": 0, "total_size": 2 << 20, "blocks": [{"size": 512, "state": "inactive"}] * 1}
    path = write(tmp_path, dumps({"segments": [seg] * 3000, "device_traces": []}))
    assert path.stat().st_size < 15_000
    refused(path, "segments[1] is the same object as segments[0]", "shared by reference")


def test_one_event_referenced_a_million_times_is_refused(tmp_path):
    path = write(tmp_path, dumps({"segments": [], "device_traces": [[event()] * 1_000_000]}))
    assert path.stat().st_size < 3_000_000
    refused(path, "device_traces[0][1] is the same object as device_traces[0][0]")


def test_shared_blocks_and_traces_are_refused(tmp_path):
    block = {"size": 512, "state": "inactive"}
    seg = {"address": 0, "total_size": 1024, "blocks": [block, block]}
    refused(write(tmp_path, dumps({"segments": [seg]})), "blocks[1] is the same object as segments[0].blocks[0]")
    trace = [event()]
    refused(write(tmp_path, dumps({"segments": [], "device_traces": [trace, trace]})),
            "device_traces[1] is the same object as device_traces[0]")


def test_the_caller_s_own_dicts_may_share():
    """parse_snapshot checks a caller's data, not a file: sharing there is the caller's choice."""
    from amem_alloc.snapshot import parse_snapshot

    trace = [event()]
    assert len(parse_snapshot({"segments": [], "device_traces": [trace, trace]})["device_traces"]) == 2


# ---------------------------------------------------------------------------- values
@pytest.mark.parametrize("fields, words", [
    ({"size": 1 << 63}, "'size' = 9223372036854775808 is out of range (it must lie in 0 .. 2^63 - 1)"),
    ({"addr": -1}, "'addr' = -1 is out of range"),
    ({"stream": 1 << 64}, "'stream'"),
    ({"action": "explode"}, "unknown action 'explode'"),
    ({"time_us": float("inf")}, "finite"),
])
def test_event_values_out_of_range_are_refused(tmp_path, fields, words):
    refused(write(tmp_path, dumps({"segments": [], "device_traces": [[event(**fields)]]})), words)


def test_segment_values_out_of_range_are_refused(tmp_path):
    seg = {"address": 0, "total_size": 1 << 63, "blocks": []}
    refused(write(tmp_path, dumps({"segments": [seg]})), "'total_size'")
    seg = {"address": 0, "total_size": 512, "device": 5000, "blocks": []}
    refused(write(tmp_path, dumps({"segments": [seg]})), "'device' = 5000", "0 .. 1023")


def test_the_largest_accepted_values_are_reported_replayed_and_exported(tmp_path, capsys):
    big = (1 << 63) - 1
    evs = [event(0, size=big - 4096), event(1, addr=1 << 62, size=1 << 62, stream=big),
           event(0, action="free_requested", size=big - 4096), event(0, action="free_completed", size=big - 4096)]
    seg = {"address": big - 4096, "total_size": big, "blocks": [{"size": big, "state": "active_allocated"}]}
    path = write(tmp_path, dumps({"segments": [seg], "device_traces": [evs]}))
    for argv in (["report", path, "-o", tmp_path / "r.html"], ["export", path, "-o", tmp_path / "t.json"],
                 ["export", path, "-f", "rmm", "-o", tmp_path / "t.csv"], ["replay", path]):
        rc = cli.main([str(a) for a in argv])
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.strip().splitlines()) <= 1, err
        assert rc in (0, 2)  # 2: a value amem cannot take, said in one line


# ---------------------------------------------------------------------------- what is read
def test_dev_zero_is_refused_at_once():
    text = refused("/dev/zero", "a character device, not a regular file", "- for standard input", seconds=1)
    assert "save the snapshot to a file" in text


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "pipe.pickle"
    os.mkfifo(fifo)
    refused(fifo, "a pipe, not a regular file", seconds=1)


@needs_trace
def test_a_pipe_given_as_provenance_or_trace_is_one_line_not_a_wait(tmp_path, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    started = time.perf_counter()
    for argv in (["report", TRACE, "--provenance", fifo, "-o", tmp_path / "r.html"], ["replay", fifo]):
        rc = cli.main([str(a) for a in argv])
        err = capsys.readouterr().err
        assert rc == 2 and "not a regular file (a device or a pipe)" in err and len(err.splitlines()) == 1, err
    assert time.perf_counter() - started < 5


def test_a_folder_is_refused(tmp_path):
    refused(tmp_path, "cannot read it", "a folder")


def test_a_file_over_the_size_cap_is_refused_before_it_is_read(tmp_path):
    path = write(tmp_path, dumps({"segments": [], "device_traces": [[event(i) for i in range(2000)]]}))
    text = refused_with_limit(path, 1000)
    assert "larger than amem reads" in text and "the limit is 1,000 bytes" in text and "--max-trace-mb" in text
    assert load_snapshot(path, max_bytes=10 << 20)["device_traces"][0]


def refused_with_limit(path, limit):
    with pytest.raises(SnapshotError) as err:
        load_snapshot(path, max_bytes=limit)
    return str(err.value)


@needs_trace
def test_standard_input_is_read_within_the_cap(tmp_path):
    out = tmp_path / "r.html"
    with open(TRACE, "rb") as stdin:
        proc = subprocess.run([sys.executable, "-m", "amem_alloc", "report", "-", "-o", str(out)], stdin=stdin,
                              capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and out.exists(), proc.stderr
    with open(TRACE, "rb") as stdin:
        proc = subprocess.run([sys.executable, "-m", "amem_alloc", "export", "-", "-o", str(tmp_path / "t.json"),
                               "--max-trace-mb", "0"], stdin=stdin, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2 and "--max-trace-mb" in proc.stderr  # 0 MiB is not a limit
    with open(TRACE, "rb") as stdin:  # a pipe larger than the cap: refused once the cap is passed
        code = ("import sys; from amem_alloc.snapshot import load_snapshot\n"
                "try:\n    load_snapshot('-', max_bytes=1000)\nexcept ValueError as e:\n    print(e)")
        proc = subprocess.run([sys.executable, "-c", code], stdin=stdin, capture_output=True, text=True,
                              timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.startswith("standard input: more than 1,000 bytes to read (the limit is 1,000 bytes)"), \
        proc.stdout + proc.stderr


# ---------------------------------------------------------------------------- the command line
@pytest.mark.parametrize("verb", ["report", "export", "replay"])
def test_every_refusal_is_one_line_from_every_reader(verb, tmp_path, capsys):
    bomb = write(tmp_path, MEMO_BOMB)
    argv = {"report": ["report", bomb, "-o", tmp_path / "r.html"], "export": ["export", bomb, "-o", tmp_path / "t"],
            "replay": ["replay", bomb]}[verb]
    for target in (bomb, "/dev/zero"):
        argv[1] = target
        rc = cli.main([str(a) for a in argv])
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
        assert lines[0].startswith(f"amem {verb}: {target}: ") and "(" in lines[0] and ";" in lines[0], lines[0]
    assert list(tmp_path.iterdir()) == [bomb]


@needs_trace
def test_max_trace_mb_raises_and_lowers_the_cap(tmp_path, capsys):
    rc = cli.main(["report", str(TRACE), "-o", str(tmp_path / "r.html"), "--max-trace-mb", "1"])
    assert rc == 0, capsys.readouterr().err
    big = write(tmp_path, TRACE.read_bytes() * 20, "big.pickle")  # 1.4 MB: over 1 MiB
    rc = cli.main(["report", str(big), "-o", str(tmp_path / "r2.html"), "--max-trace-mb", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "the limit is 1 MiB" in err and "--max-trace-mb" in err, err
    load_mod.set_max_trace_bytes(load_mod.MAX_FILE_BYTES)


def test_an_output_given_as_a_device_leaves_the_device_a_device(tmp_path):
    """Renaming a temporary over /dev/null would replace the device node with a regular file:
    a device is written straight into instead."""
    import stat as stat_mod

    from amem_alloc.atomic_write import write_text
    before = os.stat("/dev/null")
    write_text("/dev/null", "x")
    assert stat_mod.S_ISCHR(os.stat("/dev/null").st_mode) and os.stat("/dev/null").st_rdev == before.st_rdev
