"""The Python package's structure: no import cycles between amem_alloc's modules (lazy imports
inside functions included), checking a snapshot never changes the caller's dict, one device-source
handle stands for "amem's CUDA allocators" or "one Allocator", and the docs speak of the code."""
import ast
import copy
import re

import pytest

import amem_alloc
from amem_alloc import Allocator, sources
from amem_alloc.snapshot import build_snapshot, parse_snapshot, save_snapshot

from helpers import ROOT

PACKAGE = ROOT / "amem_alloc"


def _module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph():
    """module -> the amem_alloc modules it imports anywhere (top level or inside a function)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                named = {f"{target}.{a.name}" for a in node.names} & modules.keys()
                deps |= named or ({target} & modules.keys())
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names} & modules.keys()
        graph[name] = deps - {"amem_alloc"}  # the package's own __init__ re-exports everything
    return graph


def _reachable(graph, start):
    seen, todo = set(), [start]
    while todo:
        for dep in graph.get(todo.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_no_module_imports_itself_back():
    graph = _import_graph()
    assert {"amem_alloc.recording", "amem_alloc.snapshot.build", "amem_alloc.cuda"} <= graph.keys()
    cycles = sorted(m for m in graph if m in _reachable(graph, m))
    assert cycles == [], f"import cycles through {cycles}"


def _torch_style_snapshot():
    """An old torch format: blocks without addresses, segments without device/stream, no traces."""
    return {"segments": [{"address": 4096, "total_size": 2048,
                          "blocks": [{"size": 1024, "state": "active_allocated"},
                                     {"size": 1024, "state": "inactive"}]}],
            "device_traces": [[{"action": "alloc", "addr": 4096, "size": 1000, "stream": 0, "time_us": 1}]]}


def test_parse_snapshot_fills_in_a_copy_and_leaves_the_callers_dict_alone():
    data = _torch_style_snapshot()
    before = copy.deepcopy(data)
    parsed = parse_snapshot(data)
    assert data == before
    assert [b["address"] for b in parsed["segments"][0]["blocks"]] == [4096, 5120]
    assert parsed["segments"][0]["device"] == 0 and parsed["segments"][0]["frames"] == []


def test_save_snapshot_leaves_the_callers_dict_alone(tmp_path):
    data = _torch_style_snapshot()
    before = copy.deepcopy(data)
    save_snapshot(data, tmp_path / "s.pickle")
    assert data == before
    assert amem_alloc.load_snapshot(tmp_path / "s.pickle")["segments"][0]["blocks"][1]["address"] == 5120


def test_one_device_source_handle_for_cuda_and_for_an_allocator():
    a = Allocator(backend="sim")
    assert sources.device_source(None) is sources.CUDA
    handle = sources.device_source(a)
    assert handle == sources.device_source(a) and handle.backend == "sim"
    assert sources.device_source(handle) is handle
    with pytest.raises(TypeError, match="expected an amem_alloc.Allocator"):
        sources.device_source("cuda:0")
    amem_alloc.record(allocator=handle)  # public functions take the handle as well as the Allocator
    p = a.malloc(1000)
    assert handle.recording
    assert build_snapshot(handle)["device_traces"][0][-1]["addr"] == p
    assert build_snapshot(a)["amem"]["backend"] == "sim"
    amem_alloc.record(False, allocator=a)
    assert not handle.recording


def test_docs_and_comments_speak_of_the_code_not_of_its_owners():
    # "session" alone is a word of the code (prediction's FakeCudaSession); a work session is named
    # with a determiner ("this session", "the last session"), which is what is not wanted here.
    owners = re.compile(r"\bowners\b|coordinator|\b(this|that|last|next|previous|earlier|later|each|every) sessions?\b",
                        re.I)
    files = [*ROOT.joinpath("docs").glob("*.md"), ROOT / "README.md", ROOT / "benchmarks" / "RESULTS.md",
             *PACKAGE.rglob("*.py")]
    hits = [f"{p.relative_to(ROOT)}: {line.strip()}" for p in files
            for line in p.read_text().splitlines() if owners.search(line)]
    assert hits == []
