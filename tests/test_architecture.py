"""The package's layers, as docs/architecture.md draws them, checked on the import graph.

Every `import` and `from ... import` in amem_alloc (at module level or inside a function: a lazy
import is still a dependency) becomes an edge between *units*: a sub-package (amem_alloc/replay/
...) or a top-level module (amem_alloc/policies.py ...). The checks:

* the tiers of docs/architecture.md, lowest first: runtime (the top-level modules that talk to _C
  and torch) -> formats (snapshot/ and what is rebuilt from a snapshot) -> domain packages ->
  report/ -> workflows (compare/) -> commands (cli/). TIERS places every unit; a unit imports its
  own tier or lower ones, never a higher one;
* no cycle between units, within a tier too: data flows down (commands -> packages -> runtime
  modules -> _C);
* no module below the package's own __init__ reads a name defined there, neither by `from
  amem_alloc import enable` nor by `amem_alloc.enable(...)` after `import amem_alloc` (the
  version is in version.py, a leaf); importing a sibling module through `from .. import x` (or
  reading `amem_alloc.report` after `import amem_alloc`) is fine;
* the layers of docs/architecture.md: nothing imports cli/ (the commands are on top), and the
  units drawn as leaves import no other unit.
* one home per concept, as the page says: pages are built in report/, modules are tracked by
  provenance/scope.py, policies are evaluated in replay/.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "amem_alloc"
LEAVES = {"version", "provenance_format", "atomic_write", "policies", "code_files", "near_names"}  # import no other unit (policies: _C only)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(imported module, names taken from it) for every import in the file."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((target, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
    return [(t, names) for t, names in out if t == "amem_alloc" or t.startswith("amem_alloc.")]


def _unit(module: str) -> str | None:
    """amem_alloc.replay.program -> replay; amem_alloc.policies -> policies; the package itself -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        source = _unit(_module_name(path))
        if source is None:
            continue
        for target, names in _imports(path):
            targets = {_unit(target)} if target != "amem_alloc" else set(names)  # from .. import atomic_write
            for t in targets - {None, source, "_C"}:
                edges.setdefault(source, set()).add(t)
    return edges


def _submodules() -> set[str]:
    return {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir() if p.is_dir()} | {"_C"}


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path + [node, nxt]
            if nxt not in state:
                found = visit(nxt, path + [node])
                if found:
                    return found
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node, [])
            if found:
                return found[found.index(found[-1]):]
    return None


def test_no_cycle_between_packages():
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle between units of amem_alloc: " + " -> ".join(cycle)


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


IMPORT_SYSTEM = {"__file__", "__path__", "__name__", "__spec__", "__loader__", "__package__"}  # Python sets these


def _package_reads(source: str) -> list[str]:
    """X of every `amem_alloc.X` in a module that does `import amem_alloc` (a.X after `import amem_alloc as a`)."""
    tree = ast.parse(source)
    bound = {a.asname or "amem_alloc" for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names
             if a.name == "amem_alloc" or (a.asname is None and a.name.startswith("amem_alloc."))}
    return [node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound]


def test_no_module_reads_a_name_from_the_package_init():
    known = _submodules() | IMPORT_SYSTEM
    below = [path for path in PACKAGE.rglob("*.py") if path.parent != PACKAGE or path.name != "__init__.py"]
    offenders = [f"{path.relative_to(PACKAGE.parent)}: from amem_alloc import {name}"
                 for path in below for target, names in _imports(path) if target == "amem_alloc"
                 for name in names if name not in known]
    offenders += [f"{path.relative_to(PACKAGE.parent)}: amem_alloc.{name}"
                  for path in below for name in _package_reads(path.read_text(encoding="utf-8")) if name not in known]
    assert not offenders, "names defined in amem_alloc/__init__.py, read from below it:\n" + "\n".join(offenders)


def test_the_init_rule_sees_attribute_reads():
    source = ("def f():\n    import amem_alloc\n    amem_alloc.enable()\n"
              "    return amem_alloc.report.x, amem_alloc.__file__\n")
    assert sorted(_package_reads(source)) == ["__file__", "enable", "report"]
    assert _package_reads("import amem_alloc as a\na.record()\n") == ["record"]
    assert _package_reads("import amem_alloc.report as r\nr.write_report()\n") == []


# ---------------------------------------------------------------------------- the tiers
# Every unit of the package, by tier, lowest first. A unit imports units of its own tier or of
# the tiers below it, never above (docs/architecture.md draws the same table). _C, the extension,
# sits below them all and is no unit here.
TIERS = {
    # the top-level modules that talk to _C and torch, and the leaves they share
    "runtime": {"_autoenable", "allocator", "atomic_write", "calibration", "categories", "code_files", "config", "cuda",
                "devices", "doctor", "introspection", "near_names", "patching", "policies", "provenance_format", "recording",
                "script_steps", "snapshot_dump", "sources", "stacks", "torch_patch", "user_input", "user_script",
                "version"},
    # torch's snapshot format read and checked, and what is rebuilt or exported from a snapshot
    "formats": {"snapshot", "timeline", "trace_export"},
    # the packages that do amem's work on that data (the replay program format is replay/program.py);
    # predict/ counts as one unit here (its own pipeline is PREDICT_TIERS, below)
    "domain": {"replay", "provenance", "predict", "workloads"},
    "report": {"report"},  # every page, plot and text rendering, from data
    "workflows": {"compare"},  # runs domain packages end to end and writes report/'s page and plot
    "commands": {"cli", "__main__"},
}
TIER = {unit: rank for rank, units in enumerate(TIERS.values()) for unit in units}


def _module_edges() -> set[tuple[str, str]]:
    """(importing module, imported module) for every import in the package; `from .. import x` imports amem_alloc.x."""
    return {(_module_name(path), f"amem_alloc.{name}" if target == "amem_alloc" else target)
            for path in PACKAGE.rglob("*.py") for target, names in _imports(path)
            for name in (names if target == "amem_alloc" else [None])}


def _upward(edges, tier=TIER) -> list[str]:
    """The edges that go from a unit to a unit of a higher tier."""
    out = []
    for module, target in sorted(edges):
        source, dest = _unit(module), _unit(target)
        if source in tier and dest in tier and tier[dest] > tier[source]:
            names = list(TIERS)
            out.append(f"{module} ({names[tier[source]]}) imports {target} ({names[tier[dest]]})")
    return out


def test_no_unit_imports_a_higher_tier():
    offenders = _upward(_module_edges())
    assert not offenders, ("a lower tier imports a higher one (move the function down, or the module up: "
                           "docs/architecture.md):\n" + "\n".join(offenders))


def test_the_tier_check_finds_an_upward_edge():
    assert _upward({("amem_alloc.recording", "amem_alloc.snapshot.load")}) == [
        "amem_alloc.recording (runtime) imports amem_alloc.snapshot.load (formats)"]
    assert _upward({("amem_alloc.snapshot.load", "amem_alloc.recording"), ("amem_alloc.cli.main", "amem_alloc.report"),
                    ("amem_alloc.predict.api", "amem_alloc.provenance.scope")}) == []
    assert _upward({("amem_alloc.predict.api", "amem_alloc.report.predict"),
                    ("amem_alloc.doctor", "amem_alloc.compare")}) == [
        "amem_alloc.doctor (runtime) imports amem_alloc.compare (workflows)",
        "amem_alloc.predict.api (domain) imports amem_alloc.report.predict (report)"]


def test_the_tier_table_names_every_unit():
    units = {_unit(_module_name(p)) for p in PACKAGE.rglob("*.py")} - {None}
    assert not units - TIER.keys(), f"units with no tier in TIERS (give each one): {sorted(units - TIER.keys())}"
    assert not TIER.keys() - units, f"TIERS names units that are gone: {sorted(TIER.keys() - units)}"
    assert sum(map(len, TIERS.values())) == len(TIER), "a unit is in two tiers"


def test_the_commands_are_on_top_and_the_leaves_are_leaves():
    edges = _graph()
    assert not [u for u, targets in edges.items() if "cli" in targets and u != "__main__"], edges
    for leaf in LEAVES:
        assert not edges.get(leaf), f"{leaf} is drawn as a leaf in docs/architecture.md, but imports {edges[leaf]}"


def test_architecture_page_names_every_package():
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    missing = [p for p in packages if f"{p}/" not in page]
    assert not missing, f"docs/architecture.md does not say what these packages own: {missing}"


# ---------------------------------------------------------------------------- one home per concept
def _relative(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


def _outside(folder: str):
    return (p for p in PACKAGE.rglob("*.py") if not _relative(p).startswith(f"amem_alloc/{folder}/"))


def test_report_builds_every_page():
    """Outside report/, nothing reads report/html.py's page parts: the commands hand report/ data."""
    offenders = {_relative(p) for p in _outside("report") for target, names in _imports(p)
                 if target == "amem_alloc.report.html" or (target == "amem_alloc.report" and "html" in names)}
    assert not offenders, f"pages built outside report/: {sorted(offenders)}"
    assert "predict" not in _graph().get("report", set()), "report/ reads prediction objects: hand it their JSON"


def test_one_module_tracker():
    """Only provenance/scope.py's ModuleScope tracks which module runs (the Tracer and prediction share
    it); the what-if checkpointing hooks a model's first forward to wrap its blocks, which is not tracking."""
    hooks = ("register_module_forward_pre_hook", "register_module_forward_hook", "register_forward_pre_hook",
             "register_forward_hook")
    allowed = {"amem_alloc/provenance/scope.py", "amem_alloc/predict/whatif/changes.py"}
    offenders = [_relative(p) for p in PACKAGE.rglob("*.py") if _relative(p) not in allowed
                 and any(h in p.read_text(encoding="utf-8") for h in hooks)]
    assert not offenders, f"module hooks outside provenance/scope.py: {offenders}"


def test_policies_are_evaluated_in_replay():
    """replay/evaluation.py evaluates a program under several policies and names the table's cells;
    no module outside replay/ searches a minimum capacity or lays out a policy table of its own."""
    own = {"min_capacity", "policy_row", "PolicyRow", "format_table"}
    offenders = {_relative(p) for p in _outside("replay")
                 for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
                 if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in own}
    assert not offenders, f"per-policy evaluation outside replay/: {sorted(offenders)}"


# ---------------------------------------------------------------------------- predict/'s pipeline
PREDICT = PACKAGE / "predict"
# predict/'s units in the order data flows (docs/architecture.md, "From a script to a prediction"):
# a unit imports only units of a lower tier. patch_table is a tool over all of them (it loads each
# by name to print the patch catalogue).
PREDICT_TIERS = {
    "state": 0, "context": 0, "run": 0, "failures": 0, "repeat": 0, "options": 0, "scratch": 0, "stopped": 0,
    "gpus": 1, "notes": 1,
    "rules": 2,
    "engine": 3, "script_logging": 3, "batch_search": 3,
    "shims": 4, "analysis": 4, "script": 4, "decode_loop": 4,
    "whatif": 5, "stop_signals": 5,
    "api": 6,
    "fit": 7, "distributed": 7,
    "patch_table": 8, "__init__": 8,
}


def _predict_unit(path: Path) -> str:
    parts = path.relative_to(PREDICT).with_suffix("").parts
    return parts[0]


def _predict_edges() -> set[tuple[str, str]]:
    edges = set()
    for path in PREDICT.rglob("*.py"):
        source = _predict_unit(path)
        for target, names in _imports(path):
            if not target.startswith("amem_alloc.predict"):
                continue
            rest = target[len("amem_alloc.predict"):].lstrip(".")
            for unit in ([rest.split(".")[0]] if rest else names):
                if unit != source:
                    edges.add((source, unit))
    return edges


def test_predict_tiers_name_every_unit():
    units = {_predict_unit(p) for p in PREDICT.rglob("*.py")}
    assert units == set(PREDICT_TIERS), (units ^ set(PREDICT_TIERS))


def test_predict_data_flows_down_its_pipeline():
    upward = [f"{a} (tier {PREDICT_TIERS[a]}) imports {b} (tier {PREDICT_TIERS[b]})"
              for a, b in sorted(_predict_edges()) if PREDICT_TIERS[b] >= PREDICT_TIERS[a]]
    assert not upward, "predict/ imports against its pipeline:\n" + "\n".join(upward)


def test_predict_and_provenance_make_no_pages_or_text():
    """Every text, markdown and HTML renderer lives in report/: predict/ and provenance/ hand it data."""
    offenders = sorted({_relative(p) for folder in ("predict", "provenance") for p in (PACKAGE / folder).rglob("*.py")
                        for target, _ in _imports(p) if target.startswith("amem_alloc.report")})
    assert not offenders, f"these import report/: {offenders}"


def test_predict_has_no_long_function_or_file():
    long = []
    for path in PREDICT.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > 600:
            long.append(f"{_relative(path)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                long.append(f"{_relative(path)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not long, "over 600 lines a file or 60 a function in predict/:\n" + "\n".join(long)
