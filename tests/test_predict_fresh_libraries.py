"""Every rank predicted in this process starts from the library state of a new process
(amem_alloc/predict/distributed/fresh_libraries.py): the libraries its script imports are imported
afresh for it, whether a rank before it or the caller imported them, and are forgotten after it;
the environment it set and the torch functions its libraries replaced are put back; torch, its
dependencies and the standard library stay loaded.

tests/predict_models/stateful_library keeps state the ways DeepSpeed and accelerate do (a module
singleton, a class-wide dict, a handler on its logger, an environment variable, torch's F.linear
replaced for the process) and refuses to initialise where another rank's state is left; dist_library_state.py initialises it on every rank.
The real libraries are covered where they run: accelerate, the HF Trainer and DeepSpeed in
test_predict_distributed.py and test_predict_deepspeed.py, Lightning in test_predict_lightning.py."""
import logging
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from amem_alloc.predict.distributed import fresh_libraries  # noqa: E402
from amem_alloc.predict.distributed.launch import Launch  # noqa: E402
from amem_alloc.predict.distributed.ranks import predict_ranks  # noqa: E402

MODELS = Path(__file__).parent / "predict_models"
SCRIPT = [str(MODELS / "dist_library_state.py")]


def _predict(world: int, workers: int):
    return predict_ranks(Launch(world, 1, None), SCRIPT, "H100", "torch", steps=1, timeout=300, workers=workers)


@pytest.mark.parametrize("world, workers", [(2, 1), (3, 2)])
def test_every_rank_finds_the_library_state_of_a_new_process(world, workers):
    """In turn here (2 ranks), and with rank 0 here and the others in workers forked after it (3
    ranks): each rank's script initialises the library, which would refuse (the script fails) had
    it found the state a rank before it left."""
    assert "stateful_library" not in sys.modules
    linear = torch.nn.functional.linear
    path = list(sys.path)
    result = _predict(world, workers)
    assert [r.rank for r in result.ranks] == list(range(world)) and all(r.steps == 1 for r in result.ranks)
    assert "stateful_library" not in sys.modules          # forgotten after the last rank
    assert "STATEFUL_LIBRARY_RANK" not in os.environ
    assert "stateful_library" not in logging.Logger.manager.loggerDict
    assert "sympy" in sys.modules                         # torch needs it: it stays
    assert sys.path == path                               # the script's folder was the rank's only
    assert torch.nn.functional.linear is linear           # torch's again (the library replaced it)


def test_a_library_the_caller_imported_is_imported_afresh_for_each_rank_and_given_back(monkeypatch):
    """The caller's own copy, initialised as rank 7, is out of the ranks' way (else rank 0 would
    refuse) and is the caller's again afterwards, its state untouched."""
    monkeypatch.syspath_prepend(str(MODELS))
    import stateful_library

    linear = torch.nn.functional.linear
    try:
        stateful_library.init(7)
        del os.environ["STATEFUL_LIBRARY_RANK"]   # the caller's environment is the ranks' too, as torchrun's is
        torch.nn.functional.linear = linear       # and so is its torch (it stays loaded)
        handlers = list(stateful_library.logger.handlers)
        _predict(2, 1)
        assert sys.modules["stateful_library"] is stateful_library and stateful_library.GROUP == 7
        assert stateful_library.State._shared_state == {"rank": 7}
        assert logging.getLogger("stateful_library").handlers == handlers
        assert "STATEFUL_LIBRARY_RANK" not in os.environ
    finally:
        torch.nn.functional.linear = linear
        sys.modules.pop("stateful_library", None)
        logging.Logger.manager.loggerDict.pop("stateful_library", None)


def test_what_stays_the_standard_library_torch_what_they_need_and_compiled_modules():
    """The rules, one by one: the standard library and torch stay; a distribution torch declares
    (sympy) stays; a package a staying module holds stays (amem's modules hold numpy); a compiled
    extension module stays whatever its package; anything else is a library, set aside."""
    staying = fresh_libraries.Staying()
    import json
    import numpy
    import sympy

    for name, module in (("json", json), ("torch", torch), ("sympy", sympy), ("numpy", numpy),
                         ("torch._C", torch._C), ("amem_alloc", sys.modules["amem_alloc"])):
        assert not staying.forgets_module(name, module), name
    extension = sys.modules["numpy._core._multiarray_umath"]
    assert fresh_libraries._compiled(extension) and not staying.forgets_module("numpy._core._multiarray_umath",
                                                                               extension)
    assert not staying.forgets_module("_speedups", extension)   # a top-level extension stays
    plain = type(json)("somelib")
    plain.__file__ = "/site-packages/somelib/__init__.py"
    assert staying.forgets_module("somelib", plain) and staying.forgets_module("somelib.sub", plain)
    assert staying.forgets_logger("DeepSpeed", None) and not staying.forgets_logger("torch.distributed", None)


def test_a_library_that_stays_keeps_the_libraries_its_values_come_from(monkeypatch):
    """A library with a class derived from an extension's stays (the extension may have registered
    it: pyarrow's types), while the libraries it imported inside its functions were forgotten:
    jsonargparse (derived from yaml's C parser) kept docstring_parser's enum member in a dict, and
    the next rank's docstring_parser, imported again, had a new enum that member matched none
    ("KeyError: <DocstringStyle.AUTO: 255>" in litgpt's second rank). Such a library keeps the
    packages its values come from; a library that does not stay keeps nothing by its values."""
    import enum
    import types

    def library(name):
        module = types.ModuleType(name)
        module.__file__ = f"/site-packages/{name}/__init__.py"
        monkeypatch.setitem(sys.modules, name, module)
        return module

    held, other, kept, plain = library("heldlib"), library("otherlib"), library("keptlib"), library("plainlib")
    extension = library("extmod")   # taken for a compiled extension module, as yaml's _yaml is
    extension.Parser = type("Parser", (), {"__module__": "extmod"})
    compiled = fresh_libraries._compiled
    monkeypatch.setattr(fresh_libraries, "_compiled", lambda m: m is extension or compiled(m))
    held.Style = enum.Enum("Style", "AUTO GOOGLE", module="heldlib")
    other.Style = enum.Enum("Style", "AUTO", module="otherlib")
    kept.Loader = type("Loader", (extension.Parser,), {"__module__": "keptlib"})
    kept.OPTIONS = {"style": held.Style.AUTO}
    plain.OPTIONS = {"style": other.Style.AUTO}
    staying = fresh_libraries.Staying()
    assert not staying.forgets_module("keptlib", kept)     # derived from an extension's class
    assert not staying.forgets_module("heldlib", held)     # the enum member keptlib holds is its
    assert staying.forgets_module("plainlib", plain) and staying.forgets_module("otherlib", other)


def test_a_module_dynamo_put_into_torchs_globals_neither_keeps_the_library_nor_outlives_its_rank(monkeypatch):
    """dynamo puts the modules a compiled frame uses among that frame's module's globals, under
    `__import_<name>`: torch's checkpoint_wrapper.py held torchtitan's once its blocks were
    compiled. That alias does not make the library stay, and an alias to a module no longer
    imported (set aside for the next rank) is removed, else the next rank's trace of the frame
    would find the earlier rank's module there and dynamo refuse to convert it."""
    import torch.utils.checkpoint as host

    lib = type(sys)("somelib_traced")
    lib.__file__ = "/site-packages/somelib_traced/__init__.py"
    monkeypatch.setitem(sys.modules, "somelib_traced", lib)
    monkeypatch.setitem(vars(host), "__import_somelib_traced", lib)
    monkeypatch.setitem(vars(host), "__import_torch", torch)   # (a staying module's alias stays)
    assert "somelib_traced" not in fresh_libraries.Staying().tops
    with fresh_libraries.FreshLibraries():
        assert "somelib_traced" not in sys.modules
        assert "__import_somelib_traced" not in vars(host)
        assert vars(host)["__import_torch"] is torch


EXTENSION_C = r"""
#include <Python.h>
static PyObject *twice(PyObject *self, PyObject *arg) { return PyLong_FromLong(2 * PyLong_AsLong(arg)); }
static PyMethodDef methods[] = {{"twice", twice, METH_O, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_speedups", NULL, -1, methods};
PyMODINIT_FUNC PyInit__speedups(void) { return PyModule_Create(&module); }
"""
EXTENSION_LIBRARY = """
from extlib import _speedups
import extlib._speedups as again

STATE = {}


def init(rank):
    if STATE:
        raise SystemExit(f"rank {rank}: extlib was initialised by rank {STATE['rank']}")
    STATE["rank"] = rank
    assert _speedups.twice(rank) == 2 * rank and again is _speedups
    print(f"rank {rank}: extension {id(_speedups)}")
"""
EXTENSION_SCRIPT = """
import torch, torch.distributed as dist
import extlib
dist.init_process_group("nccl")
extlib.init(dist.get_rank())
x = torch.empty(1 << 20, device="cuda")
"""


def test_a_library_with_an_extension_of_its_own_is_imported_afresh_and_the_extension_served_again(tmp_path, capfd):
    """Megatron keeps its parsed arguments in module globals and refuses to initialise twice; it
    also builds a pybind11 extension inside its package (its dataset helpers), which once kept the
    whole package for every rank ("args is already initialized" on rank 1). An extension that holds
    nothing of its package's Python code goes with the package, and the next rank's import gets the
    module loaded before (CPython loads an extension once per process), as its package's attribute."""
    import shutil
    import subprocess
    import sysconfig

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the test's extension")
    package = tmp_path / "extlib"
    package.mkdir()
    (package / "__init__.py").write_text(EXTENSION_LIBRARY)
    (tmp_path / "speedups.c").write_text(EXTENSION_C)
    target = package / ("_speedups" + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run([compiler, "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}",
                    str(tmp_path / "speedups.c"), "-o", str(target)], check=True)
    script = tmp_path / "uses_extlib.py"
    script.write_text(EXTENSION_SCRIPT)
    result = predict_ranks(Launch(2, 1, None), [str(script)], "H100", "torch", steps=0, timeout=300, workers=1)
    out = capfd.readouterr().out
    ids = {line.split()[-1] for line in out.splitlines() if line.startswith("rank ") and "extension" in line}
    assert "rank 0: extension" in out and "rank 1: extension" in out, out
    assert len(ids) == 1, out   # the same module object, served again
    assert [r.rank for r in result.ranks] == [0, 1]
    assert "extlib" not in sys.modules and "extlib._speedups" not in sys.modules


def test_a_package_that_defined_operators_with_torch_library_define_stays(monkeypatch):
    """torch.library.define keeps its Library for the process (torch.library._keep_alive): the
    package of that namespace stays, else a rank's import defined its operators again (bitsandbytes,
    imported by transformers: "Tried to register an operator (bitsandbytes::...) multiple times")."""
    import types

    import torch.library

    module = types.ModuleType("definedlib")
    module.__file__ = "/site-packages/definedlib/__init__.py"
    monkeypatch.setitem(sys.modules, "definedlib", module)
    assert fresh_libraries.Staying().forgets_module("definedlib", module)
    lib = torch.library.Library("definedlib", "FRAGMENT")
    monkeypatch.setattr(torch.library, "_keep_alive", torch.library._keep_alive + [lib])
    try:
        assert not fresh_libraries.Staying().forgets_module("definedlib", module)
    finally:
        lib._destroy()
