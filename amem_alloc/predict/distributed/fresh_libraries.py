"""Each rank run in this process starts from the library state of a new process: its script's
libraries are imported afresh for it and forgotten when it ends.

Design note
-----------
torchrun starts every rank in a process of its own; prediction runs the ranks one after another in
one process (ranks.py), and forked workers take further ranks from a process that has already run
one (recording.py). Libraries keep per-process state in module globals and class attributes:
DeepSpeed its process groups (deepspeed/utils/groups.py), its communication backend
(deepspeed/comm/comm.py `cdb`) and its accelerator (deepspeed/accelerator/real_accelerator.py,
chosen at first use); accelerate its `PartialState._shared_state` singletons; transformers the
Trainer's DeepSpeed config (integrations/deepspeed.py, a module-level weak reference); Lightning
and torchtitan their own; a script its helper modules. Left by rank 0, they made rank 1's
DeepSpeed use rank 0's destroyed groups ("Group ... is not registered") and rank 1's accelerate
take its destroyed process group for initialised.

One mechanism, for every library whether anyone listed it or not: around a rank, the modules of
every *library* (below) are out of sys.modules — those imported before the rank are set aside,
so the rank's script imports them again, under prediction (DeepSpeed picks its accelerator
seeing the fake GPU), and those the rank imported are dropped at its end, with the ones set aside
put back. Every module-level singleton then starts as in a new process: rank 1 of DeepSpeed,
accelerate, Lightning or transformers is rank 0 run again, not rank 0 continued. A library is a
top-level package other than these, which stay, shared by every rank:

* the standard library; torch, amem and every distribution they declare they need
  (importlib.metadata, transitively: sympy, triton, ...); `__main__` (the caller's program; what
  it imported is not kept for it: a notebook's libraries are set aside like any);
* every top-level package that a module which stays has imported (holds among its globals as a
  module): amem's modules hold numpy. Two copies would split its classes between what stays and
  the next rank's code;
* compiled extension modules at the top level; and a package with a compiled extension module
  inside it that holds the package's Python modules or classes (a Cython module's imports: pandas'
  `_libs`) stays whole, as the extension would keep the previous rank's. Any other extension
  module goes with its package (Megatron's pybind11 dataset helpers: Megatron keeps its parsed
  arguments in module globals and refuses to initialise twice) and, CPython loading an extension
  once per process, is served as loaded before when the next rank imports it again, made its new
  package's attribute by the import machinery (KeptExtensions);
* a package named by the namespace of operators defined with `torch.library.define`
  (bitsandbytes'): torch keeps their Library for the process, and a second import would define
  them again ("registered multiple times");
* a package that defines classes derived from a compiled extension's (other than torch's and the
  standard library's): the extension may have registered them for the process (datasets' pyarrow
  extension types, which a second import cannot register again).

Loggers belong to the package their name starts with and go with it: a library imported again
adds its handler to the logger it finds, and rank 1 would print each line twice. The import path
(sys.path) is a copy while the rank runs (user_script.py puts the script's folder first), and the
environment is put back as it was (a rank's script or its libraries set variables the next process would not
see: accelerate and transformers do). The dropped modules are collected at once (gc.collect):
a library's torch.library registrations are undone when their Library objects die, before the
next rank's import registers them again; a Library among a dropped module's globals is destroyed
first (its registrations undone), as one whose fake kernel torch's registry holds never dies
(torchao's). A one-process prediction that finds the job's ranks (spawn.py) drops every library
it imported the same way before the ranks run (`forget_libraries`).

Weighed and not taken:
* a reset per library (the `_forget_accelerate_state` this replaces): misses every library not listed;
* snapshotting the modules' globals and class attributes and restoring them: a module first
  imported during rank 0 has no state from before to restore, and state inside objects (a
  singleton instance's attributes, a dict filled in place) needs deep copies of arbitrary objects;
* a new process per rank: torch's import and first-call caches would be rebuilt for every rank,
  and one process must still work where fork does not. (DTensor's caches of sharding decisions
  hold a rank's meshes, compared by value: those are emptied between ranks, below.)
Cost: each rank imports its libraries again (measured on 2 cores outside prediction: transformers'
Trainer 2-3 s, Lightning 3.4 s, DeepSpeed 0.5 s, accelerate 0.2 s; more under prediction: a
2-rank Lightning DDP prediction went from 27.9 to 37.9 s), one walk of the modules that stay and a
note of what they hold (tenths of a second) and one garbage collection per rank.

What a rank's libraries replaced in what stays is put back too: the functions, classes and modules
that the modules of torch and the other staying packages (not the standard library's) and the
classes they define held before the rank (DeepSpeed ZeRO-3 sets `torch.nn.functional.linear` to
its own for the process, "This will persist unless manually reset": a DDP job predicted after it
in the same process had other gradient buckets). Values are left as the rank left them (torch's
own flags and caches), and so are attributes added.

Not reset: values a rank's libraries changed inside what stays (torch's global settings such as
the default dtype or matmul precision, its pytree registrations, threads they started) and the
standard library's tables other than loggers (warnings filters, atexit); process groups are
destroyed at each rank's end (process_group.py).
"""
from __future__ import annotations

import functools
import gc
import importlib.machinery
import itertools
import logging
import os
import re
import sys
import types
import warnings
from typing import Any

import torch

from ...patching import PatchSet, declare

MODULES = declare("sys.modules", "every library's modules",
                  "each rank imports its libraries afresh: set aside while it runs, what it imported dropped after")
LOGGERS = declare("logging.Logger.manager.loggerDict", "every library's loggers",
                  "go with their library's modules: a library imported again makes its logger again")
ENVIRONMENT = declare("os.environ", "every variable a rank's script set",
                      "put back at the rank's end: the next rank's process would not see it")
REPLACED = declare("torch and every package that stays (not the standard library)",
                   "the functions and classes their modules and classes hold",
                   "put back at a rank's end where its libraries replaced them (DeepSpeed ZeRO-3's "
                   "torch.nn.functional.linear)")
FINDERS = declare("sys", "meta_path", "a copy, first of all finders the one that serves a compiled extension "
                  "dropped with its package as loaded before (KeptExtensions)")
IMPORT_PATH = declare("sys", "path", "a copy while a rank runs: the folders its script added (its own) are its only")
STAYING_DISTRIBUTIONS = ("torch", "amem_alloc", "amem-alloc")
DYNAMO_IMPORT = "__import_"   # dynamo's name for a module it put among a compiled frame's globals
MAIN = frozenset({"__main__", "__mp_main__"})   # the caller's program: stays, and what it holds is not kept for it


class FreshLibraries:
    """Context manager: the libraries' modules and loggers out of the way while one rank runs (see
    above); afterwards the environment, sys.path and what the rank's libraries replaced in torch as
    they were."""

    def __init__(self) -> None:
        self.patches = PatchSet()

    def __enter__(self) -> "FreshLibraries":
        staying = Staying()
        self.patches.callback(gc.collect)   # last: the dropped modules' objects die before the next rank
        self.patches.restore_mapping(ENVIRONMENT, os.environ)
        self.patches.apply(IMPORT_PATH, sys, "path", list(sys.path))
        self.patches.set_aside(LOGGERS, logging.Logger.manager.loggerDict, staying.forgets_logger)
        self.patches.callback(_clear_logger_caches)
        self.patches.set_aside(MODULES, sys.modules, staying.forgets_module)
        self.patches.callback(_undefine_operators, staying)   # before the rank's modules are dropped
        self.patches.apply(FINDERS, sys, "meta_path", [KeptExtensions] + sys.meta_path)
        self.patches.keep_attributes(REPLACED, staying.patchable(), _is_code)
        _forget_sharding_decisions()
        self.patches.callback(_forget_sharding_decisions)
        _forget_dynamos_imports()
        self.patches.callback(_forget_dynamos_imports)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.patches.close()
        self.patches = PatchSet()


def forget_libraries() -> None:
    """Drops every library's modules and loggers from this process, as a new process has none of
    them: what a one-process prediction imported before it found the job's ranks (spawn.py), so
    that the ranks' runs do not find them set aside, alive, with their registrations (torchao's
    torch.library operators, defined again by the rank's import: "registered multiple times")."""
    staying = Staying()
    _undefine_operators(staying)
    for name, module in list(sys.modules.items()):
        if staying.forgets_module(name, module):
            sys.modules.pop(name, None)
    loggers = logging.Logger.manager.loggerDict
    for name, logger in list(loggers.items()):
        if staying.forgets_logger(name, logger):
            loggers.pop(name, None)
    _clear_logger_caches()
    _forget_dynamos_imports()
    gc.collect()


def _undefine_operators(staying: Staying) -> None:
    """The operators that modules about to be dropped defined with a `torch.library.Library` of
    their own globals are undefined now, as the Library's finalizer would when it died: torchao's
    does not die (the fake kernels it registered are held by torch's registries and hold its
    module's globals), and the next import's definitions met the old ones ("Tried to register an
    operator (torchao::int_matmul...) ... multiple times"). Operators defined with
    `torch.library.define` keep their package (_defined_operators)."""
    for name, module in list(sys.modules.items()):
        if module is None or not staying.forgets_module(name, module):
            continue
        for value in list(getattr(module, "__dict__", {}).values()):
            if isinstance(value, torch.library.Library) and getattr(value, "m", None) is not None:
                value._destroy()


def _forget_sharding_decisions() -> None:
    """DTensor's caches of decisions (sharding propagation, redistribution plans, expanded
    strategies, mesh topologies) start empty for each rank: their keys compare meshes by value, so
    a later rank's lookup would return what the earlier rank's cached, with that rank's mesh
    objects, and FSDP2 refuses a parameter whose mesh is not the very one it was given
    (torchtitan's rank 1: "different mesh objects"). The propagator's per-thread cache is replaced,
    not cleared (clearing reaches one thread's)."""
    if "torch.distributed.tensor" not in sys.modules:
        return
    for cache in _distributed_caches():
        cache.cache_clear()
    native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)   # its C++ dispatch's
    if native is not None:
        native()
    try:
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor._sharding_prop import LocalLRUCache
    except ImportError:   # a torch without DTensor's per-thread cache
        return
    propagator = DTensor._op_dispatcher.sharding_propagator
    propagator.propagate_op_sharding = LocalLRUCache(propagator.propagate_op_sharding_non_cached)


def _forget_dynamos_imports() -> None:
    """dynamo's cache of the modules it imports for guards (symbolic_convert._import_module, one
    per process) starts empty for each rank: left from rank 0, rank 1's compiled code read its
    guards through rank 0's modules (torchtitan's compiled loss: rank 0's empty spmd mesh stack,
    "list index out of range", and the region fell back to eager on rank 1 only)."""
    convert = sys.modules.get("torch._dynamo.symbolic_convert")
    cached = getattr(convert, "_import_module", None)
    if cached is not None and hasattr(cached, "cache_clear"):
        cached.cache_clear()
    _forget_dynamos_aliases()


def _forget_dynamos_aliases() -> None:
    """The modules dynamo put among a compiled frame's globals (`__import_<module>`) that are no
    longer imported as they were: a library set aside or dropped with a rank. Left there, the next
    rank's trace of the same frame (torch's checkpoint_wrapper.py, around torchtitan's blocks)
    finds the earlier rank's module under the alias and dynamo refuses to convert it ("expected
    alias not in f_globals or f_globals[alias] is value")."""
    for module in list(sys.modules.values()):
        table = getattr(module, "__dict__", None)
        if not isinstance(table, dict):
            continue
        for key, value in list(table.items()):
            if str(key).startswith(DYNAMO_IMPORT) and isinstance(value, types.ModuleType) \
                    and sys.modules.get(getattr(value, "__name__", "")) is not value:
                del table[key]


_CACHES: dict = {"modules": 0, "found": []}


def _distributed_caches() -> list:
    """The functools caches of torch.distributed's functions, found among every object (some are
    closures made at op registration) when its modules last changed in number."""
    loaded = sum(1 for name in list(sys.modules) if name.startswith("torch.distributed"))
    if loaded != _CACHES["modules"]:
        _CACHES["modules"] = loaded
        # type(), not isinstance(): isinstance asks a weakref.proxy for __class__, which raises
        # ReferenceError once its object is gone (one was among gc's objects after a test's rank)
        _CACHES["found"] = [o for o in gc.get_objects() if type(o) is functools._lru_cache_wrapper
                            and str(getattr(getattr(o, "__wrapped__", None), "__module__", "")).startswith("torch.distributed")]
    return _CACHES["found"]


def _clear_logger_caches() -> None:
    clear = getattr(logging.Logger.manager, "_clear_cache", None)   # the loggers' effective-level caches
    if clear is not None:
        clear()


class Staying:
    """Which top-level packages stay (the list above): found when made, and again for the modules
    imported since whenever asked about one not seen yet."""

    def __init__(self) -> None:
        self.given = set(MAIN) | _stdlib_tops() | _declared_tops()   # stay whatever they hold
        self.tops = set(self.given)
        self.walked: set[str] = set()
        self.seen: set[str] = set()
        self._walk()

    def forgets_module(self, name: str, module: Any) -> bool:
        if name not in self.seen:   # imported since the last walk: what it holds may stay
            self._walk()
        if _top(name) in self.tops:
            return False
        if _compiled(module):
            if "." not in name:
                return False
            KEPT_EXTENSIONS[name] = module   # goes with its package; served again by KeptExtensions
        return True

    def forgets_logger(self, name: str, logger: Any) -> bool:
        return _top(name) not in self.tops

    def patchable(self) -> list:
        """The modules that stay, other than the standard library's and amem's (whose changes are
        amem's own, undone by their PatchSets), and the classes they define."""
        out = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # some modules' globals warn when touched (deprecated aliases)
            for name, module in list(sys.modules.items()):
                out += self._patchable_in(name, module)
        return out

    def _patchable_in(self, name: str, module: Any) -> list:
        """The module and the classes it defines, where it stays and is neither the standard
        library's nor amem's."""
        top = _top(name)
        if module is None or top in _stdlib_tops() or top in MAIN or top == "amem_alloc" \
                or self.forgets_module(name, module):
            return []
        return [module] + [v for v in list(vars(module).values())
                           if isinstance(v, type) and v.__dict__.get("__module__") == name]

    def _walk(self) -> None:
        """Adds to `tops` every package a staying module has imported, until none is new."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # some modules' globals warn when touched (deprecated aliases)
            while True:
                modules = list(sys.modules.items())
                self.tops |= {_top(n) for n, m in modules if n not in self.seen and _registers_in_extension(n, m)}
                self.tops |= _defined_operators()
                self.seen.update(n for n, _ in modules)
                todo = [(n, m) for n, m in modules
                        if n not in self.walked and n not in MAIN and (_top(n) in self.tops or _compiled(m))]
                if not todo:
                    return
                for name, module in todo:
                    self.walked.add(name)
                    self.tops |= _held_tops(module) - {_top(name)}
                    if _top(name) not in self.given:   # a library that stays keeps what its values are
                        self.tops |= _held_value_tops(module) - {_top(name)}
                    if "." in name and _compiled(module) and _refers_to_its_package(name, module):
                        self.tops.add(_top(name))   # its package cannot be imported again around it


def _is_code(value: Any) -> bool:
    """A function, class or module: what a library replaces when it patches another (values such as
    flags and caches are torch's own to change)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # deprecated aliases warn when their class is asked (reduce_op)
        return isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type, types.ModuleType,
                                  staticmethod, classmethod, property))


def _top(name: str) -> str:
    return name.partition(".")[0]


def _compiled(module: Any) -> bool:
    """A compiled extension module (or a built-in one): loaded once per process."""
    spec = getattr(module, "__spec__", None)
    loader = getattr(spec, "loader", None)
    if loader is importlib.machinery.BuiltinImporter or isinstance(loader, importlib.machinery.ExtensionFileLoader):
        return True
    origin = getattr(spec, "origin", None) or getattr(module, "__file__", None) or ""
    return isinstance(origin, str) and origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def _refers_to_its_package(name: str, module: Any) -> bool:
    """Whether a compiled extension module holds modules or classes of its own package's Python
    code (a Cython module's imports): that package stays whole, or the extension would keep the
    previous rank's. One that holds none (Megatron's pybind11 dataset helpers) goes with its
    package and is served again, as it is, when the next rank imports it (KeptExtensions)."""
    top = _top(name)
    for value in list(getattr(module, "__dict__", {}).values()):
        if isinstance(value, types.ModuleType):
            home = value
        elif isinstance(value, type):
            home = sys.modules.get(getattr(value, "__module__", "") or "")
        else:
            continue
        home_name = getattr(home, "__name__", None)
        if isinstance(home_name, str) and _top(home_name) == top and home_name != name and not _compiled(home):
            return True
    return False


KEPT_EXTENSIONS: dict[str, Any] = {}   # compiled extension modules whose package a rank dropped, by name


class KeptExtensions:
    """An import finder: a compiled extension module a rank dropped with its package is the one
    loaded before when the package is imported again (CPython loads an extension once per process;
    importing it anew would build a second module over the same C state). The import machinery
    then makes it its new package's attribute, as for any submodule."""

    @staticmethod
    def find_spec(name: str, path: Any = None, target: Any = None) -> Any:
        module = KEPT_EXTENSIONS.get(name)
        if module is None:
            return None
        return importlib.machinery.ModuleSpec(name, _Served(module), origin=getattr(module, "__file__", None))


class _Served:
    def __init__(self, module: Any) -> None:
        self.module = module

    def create_module(self, spec: Any) -> Any:
        return self.module

    def exec_module(self, module: Any) -> None:
        return None


def _registers_in_extension(name: str, module: Any) -> bool:
    """Whether a library module defines a class derived from a class of a compiled extension outside
    torch and the standard library: such an extension may keep the class in a registry of its own,
    which outlives the module (datasets registers its pyarrow extension types at import, and
    pyarrow refuses the second import's: "type extension ... already defined")."""
    if module is None or _top(name) in _stdlib_tops() or _top(name) in _declared_tops() or _compiled(module):
        return False
    for value in list(getattr(module, "__dict__", {}).values()):
        if isinstance(value, type) and value.__dict__.get("__module__") == name:
            for base in value.__mro__[1:]:
                home = sys.modules.get(getattr(base, "__module__", "") or "")
                top = _top(base.__module__ or "")
                if home is not None and _compiled(home) and top not in _stdlib_tops() \
                        and top not in _declared_tops():
                    return True
    return False


def _held_tops(module: Any) -> set[str]:
    """The top-level packages of the modules among a module's globals (what it imported as a
    module). Functions and classes do not count: libraries put theirs into torch's modules (torch's
    `_disable_dynamo_if_unsupported` writes an optimizer's fallback into torch.optim.optimizer's
    globals: DeepSpeed's, from zenflow_torch_adam), which would keep the library for every rank.
    Nor do the modules dynamo puts into the globals of a module whose frame it compiled (named
    `__import_<module>`, symbolic_convert.py), which reference the code it traced into: torch's
    checkpoint_wrapper.py held torchtitan once torchtitan's checkpointed blocks were compiled."""
    out = set()
    for key, value in list(getattr(module, "__dict__", {}).items()):
        if isinstance(value, types.ModuleType) and not str(key).startswith(DYNAMO_IMPORT):
            name = getattr(value, "__name__", None)
            if isinstance(name, str):
                out.add(_top(name))
    return out


_LOOKED_AT = 256   # items of one container _held_value_tops looks at


def _defined_operators() -> set[str]:
    """The namespaces of the operators defined with `torch.library.define` (bitsandbytes'): torch
    keeps their Library for the process (`torch.library._keep_alive`), so a package of that name
    stays, as a new import of it would define them again ("registered multiple times"), whether
    the caller or a rank imported it."""
    return {getattr(lib, "ns", None) for lib in list(getattr(torch.library, "_keep_alive", []))} - {None}


def _held_value_tops(module: Any) -> set[str]:
    """The top-level packages whose classes made the objects among a library module's globals, or
    in a global container (a dict's keys and values, a list's items; one level). Asked only of a
    library that stays while the packages it imported are forgotten (one with a class derived from
    an extension's, above): jsonargparse, which derives from yaml's C parser, keeps the
    docstring_parser style it chose (an enum member, compared by identity) in a module dict; a
    second import of docstring_parser made a new enum and jsonargparse's member matched none
    ("KeyError: <DocstringStyle.AUTO: 255>" in the next rank). torch's and the other given
    packages' values are not asked: libraries leave objects of their own in torch's tables."""
    out = set()
    for value in list(getattr(module, "__dict__", {}).values()):
        items = [value]
        if isinstance(value, dict):
            items += [x for pair in itertools.islice(list(value.items()), _LOOKED_AT) for x in pair]
        elif isinstance(value, (list, tuple, set, frozenset)):
            items += list(itertools.islice(value, _LOOKED_AT))
        for item in items:
            if isinstance(item, (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType)):
                continue
            home = getattr(type(item), "__module__", None)
            if isinstance(home, str) and home != "builtins":
                out.add(_top(home))
    return out


@functools.lru_cache(maxsize=None)
def _stdlib_tops() -> frozenset[str]:
    names = getattr(sys, "stdlib_module_names", None)   # Python 3.10+
    if names is not None:
        return frozenset(names) | frozenset(sys.builtin_module_names)
    import sysconfig

    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    out = set(sys.builtin_module_names)
    for name, module in list(sys.modules.items()):
        path = os.path.realpath(getattr(module, "__file__", None) or "")
        if path.startswith(stdlib) and "site-packages" not in path:
            out.add(_top(name))
    return frozenset(out)


@functools.lru_cache(maxsize=None)
def _declared_tops() -> frozenset[str]:
    """torch's and amem's top-level packages, and those of every distribution they need."""
    import importlib.metadata as metadata

    tops, seen, todo = {"torch", "amem_alloc"}, set(), list(STAYING_DISTRIBUTIONS)
    while todo:
        name = _normal(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        tops |= _distribution_tops(distribution)
        todo += [re.match(r"[A-Za-z0-9._-]+", r).group(0) for r in distribution.requires or [] if "extra ==" not in r]
    return frozenset(tops)


def _distribution_tops(distribution: Any) -> set[str]:
    """The top-level modules a distribution installs: its top_level.txt, else its files' first parts
    (reading only these distributions: importlib.metadata.packages_distributions reads them all)."""
    listed = distribution.read_text("top_level.txt")
    if listed:
        return {line.strip() for line in listed.splitlines() if line.strip()}
    out = set()
    for path in distribution.files or []:
        first = path.parts[0] if path.parts else ""
        name = first[:-3] if first.endswith(".py") else first if len(path.parts) > 1 else ""
        if name.isidentifier() and not name.startswith("__"):   # not __pycache__
            out.add(name)
    return out


def _normal(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()
