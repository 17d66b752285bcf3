"""Every change amem makes to another library's attributes goes through here: one declaration per
change (what is replaced, by whom, and why), one mechanism that applies it and undoes it.

Design note
-----------
amem replaces attributes of torch and of other libraries in two places: enable() makes torch's
memory functions answer from amem (torch_patch.py), and prediction makes a whole process believe
it has a GPU (predict/: the engine, the torch.cuda shims, distributed, what-ifs). Each such change
is *declared* once, at import of the module that makes it:

    PIN = declare("torch.Tensor", "pin_memory", "pinning needs a CUDA driver: an ordinary copy")

and *applied* through a PatchSet, which records what was there and puts it back on exit, last
change first, whatever happened in between:

    with PatchSet() as patches:
        patches.apply(PIN, torch.Tensor, "pin_memory", pin_memory)

`apply` refuses a change that was not declared (so CATALOGUE, the table docs/predict.md prints,
is every change amem can make), and restores exactly what it found in the object's own __dict__:
an attribute that a class (or an instance) inherited is deleted again rather than copied onto it;
one that did not exist is removed.
A declaration's owner is the dotted path of what is patched, or words for what has no path (an
optimizer instance, a user's model class); its attribute may name a family ("every in-place
initializer"), where `apply` is then called once per member.

Environment variables that amem sets for a prediction (a child's marker, torchrun's variables)
go through `setenv` under a declaration too. A whole table of the interpreter's (os.environ,
sys.modules, logging's loggers) is kept as it was with `restore_mapping` (what was added or changed
is undone on exit) and `set_aside` (some of its items taken out until exit: distributed/
fresh_libraries.py gives each in-process rank its libraries afresh so), and what modules and
classes hold is put back where something rebound it with `keep_attributes`, each under a
declaration. Python audit events (a file opened for writing, a program started) reach a handler
through `listen`, under a declaration too.
"""
from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator, MutableMapping

_MISSING = object()   # an attribute the object did not hold itself (inherited, or absent), or an unset variable


@dataclass(frozen=True)
class Patch:
    owner: str        # what is patched: a dotted path ("torch.cuda"), or words ("an optimizer instance")
    attribute: str    # the attribute replaced, or a family of them ("every in-place initializer")
    why: str          # one line: what the replacement does and why amem needs it
    by: str           # the module that declares (and applies) it


CATALOGUE: list[Patch] = []


def declare(owner: str, attribute: str, why: str) -> Patch:
    """Declares a change (once per module import); the Patch to hand to PatchSet.apply."""
    caller = sys._getframe(1).f_globals.get("__name__", "?")
    patch = Patch(owner, attribute, why, caller)
    if patch not in CATALOGUE:
        CATALOGUE.append(patch)
    return patch


def declare_many(owner: str, attributes: Iterator[str] | list[str], why: str) -> dict[str, Patch]:
    """One declaration per attribute, sharing `why` (a table of replacements, e.g. torch.cuda's)."""
    caller = sys._getframe(1).f_globals.get("__name__", "?")
    out = {}
    for name in attributes:
        patch = Patch(owner, name, why, caller)
        if patch not in CATALOGUE:
            CATALOGUE.append(patch)
        out[name] = patch
    return out


def _own_value(obj: Any, name: str) -> Any:
    """What `obj` itself holds under `name` (its __dict__: a module's, a class's, an instance's), not
    what it inherits from its class or bases; objects without a __dict__ answer getattr."""
    own = getattr(obj, "__dict__", None)
    if own is not None and hasattr(own, "get"):
        return own.get(name, _MISSING)
    return getattr(obj, name, _MISSING)


def _restore(obj: Any, name: str, value: Any) -> None:
    if value is _MISSING:
        with contextlib.suppress(AttributeError):
            delattr(obj, name)
    else:
        setattr(obj, name, value)


def _restore_env(name: str, value: Any) -> None:
    if value is _MISSING:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _restore_mapping(mapping: MutableMapping, before: dict) -> None:
    for key in [k for k in list(mapping) if k not in before]:
        mapping.pop(key, None)
    for key, value in before.items():
        now = mapping.get(key, _MISSING)
        if now is not value and now != value:
            mapping[key] = value


def _put_back_rebound(before: list[tuple[Any, dict]]) -> None:
    for obj, attributes in before:
        now = obj.__dict__
        for name, value in attributes.items():
            if now.get(name, _MISSING) is not value:
                with contextlib.suppress(AttributeError, TypeError):   # a type that cannot be set
                    setattr(obj, name, value)


def _put_aside_back(mapping: MutableMapping, taken: dict, forget: Callable[[str, Any], bool]) -> None:
    for key, value in list(mapping.items()):
        if key not in taken and forget(key, value):
            mapping.pop(key, None)
    mapping.update(taken)


def _remove_filter(entry) -> None:
    import warnings

    if entry in warnings.filters:
        warnings.filters.remove(entry)
        mutated = getattr(warnings, "_filters_mutated", None) or getattr(warnings, "_filters_mutated_lock_held", None)
        if mutated is not None:   # the module's cache of decisions made under the old filters
            mutated()


class _OnImport:
    """An import finder: once the module `name` has been imported (found by the finders after this
    one, executed by its own loader), `then()` runs."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name, self.then, self.busy = name, then, False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name or self.busy:
            return None
        self.busy = True
        try:
            spec = next((s for s in (getattr(f, "find_spec", lambda *a: None)(fullname, path, target)
                                     for f in sys.meta_path if f is not self) if s is not None), None)
        finally:
            self.busy = False
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Then(spec.loader, self.then)
        return spec


class _Then:
    """A loader that runs `then()` after its module executed; anything else is the loader's."""

    def __init__(self, loader: Any, then: Callable[[], None]) -> None:
        self._loader, self._then = loader, then

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        self._then()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class PatchSet:
    """Applies declared changes and undoes them, last first, on exit (or close())."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self.applied: list[tuple[Patch, Any, str, Any]] = []   # (declaration, owner, name, what was there)

    def apply(self, patch: Patch, obj: Any, name: str, replacement: Any) -> Any:
        """Replaces obj.name by `replacement`; returns what was there (None if nothing was)."""
        if patch not in CATALOGUE:
            raise AssertionError(f"amem: an undeclared patch of {name!r} (declare it with amem_alloc.patching.declare)")
        before = _own_value(obj, name)
        setattr(obj, name, replacement)
        self._stack.callback(_restore, obj, name, before)
        self.applied.append((patch, obj, name, before))
        return None if before is _MISSING else before

    def apply_all(self, patches: dict[str, Patch], obj: Any, replacements: dict[str, Any],
                  existing_only: bool = False) -> None:
        """apply() for each name of `replacements` (its declaration in `patches`); with existing_only,
        names `obj` does not have are left alone."""
        for name, value in replacements.items():
            if existing_only and not hasattr(obj, name):
                continue
            self.apply(patches[name], obj, name, value)

    def setenv(self, patch: Patch, name: str, value: str) -> None:
        if patch not in CATALOGUE:
            raise AssertionError(f"amem: an undeclared change of the environment variable {name!r}")
        before = os.environ.get(name, _MISSING)
        os.environ[name] = value
        self._stack.callback(_restore_env, name, before)
        self.applied.append((patch, os.environ, name, before))

    def restore_mapping(self, patch: Patch, mapping: MutableMapping) -> None:
        """On exit, `mapping` (os.environ, ...) as it is now: keys added since are removed, keys
        changed or removed get their values back."""
        self._check(patch, "the table")
        self._stack.callback(_restore_mapping, mapping, dict(mapping))

    def set_aside(self, patch: Patch, mapping: MutableMapping, forget: Callable[[str, Any], bool]) -> None:
        """The items of `mapping` that `forget(key, value)` accepts are taken out of it until exit; on
        exit, those it accepts then (added since) are removed and the ones taken out put back."""
        self._check(patch, "the table")
        taken = {k: v for k, v in list(mapping.items()) if forget(k, v)}
        for key in taken:
            mapping.pop(key, None)
        self._stack.callback(_put_aside_back, mapping, taken, forget)

    def keep_attributes(self, patch: Patch, objects: list, kept: Callable[[Any], bool]) -> None:
        """On exit, each attribute that one of `objects` (modules, classes) holds now, whose value
        `kept` accepts and which was rebound or deleted since, is given its value back (attributes
        added since stay)."""
        self._check(patch, "the attributes of")
        before = [(obj, {k: v for k, v in list(vars(obj).items()) if kept(v)}) for obj in objects]
        self._stack.callback(_put_back_rebound, before)

    def ignore_warning(self, patch: Patch, message: str) -> None:
        """One warning (its message, a regular expression matched at its start) not shown until
        exit: a filter put first in warnings.filters, in place (the C module shares that list),
        and removed on exit."""
        import warnings

        self._check(patch, "the warnings of")
        warnings.filterwarnings("ignore", message=message)
        self._stack.callback(_remove_filter, warnings.filters[0])

    def when_imported(self, patch: Patch, module: str, then: Callable[[], None]) -> None:
        """then() once the module `module` is imported: now if it is, else as its import finishes
        (a finder put first in a copy of sys.meta_path, under `patch`, wraps the module's loader);
        the finder is gone on exit."""
        if module in sys.modules:
            then()
            return
        self.apply(patch, sys, "meta_path", [_OnImport(module, then)] + sys.meta_path)

    def listen(self, patch: Patch, events: tuple[str, ...], handler: Callable[[str, tuple], None]) -> None:
        """handler(event, args) for the Python audit events named (`open`, `subprocess.Popen`, ...)
        until exit. Of nested listeners under one declaration (a what-if trial inside a
        prediction), the innermost hears each event; a handler's exception is dropped (raised from
        an audit hook it would become the program's)."""
        self._check(patch, "the audit events")
        if not _AUDIT_HOOKED:   # audit hooks cannot be removed: one per process, idle without listeners
            sys.addaudithook(_on_audit_event)
            _AUDIT_HOOKED.append(True)
        entry = (frozenset(events), handler)
        _LISTENERS.setdefault(patch, []).append(entry)
        _listened_events_changed()
        self._stack.callback(_stop_listening, patch, entry)

    def _check(self, patch: Patch, what: str) -> None:
        if patch not in CATALOGUE:
            raise AssertionError(f"amem: an undeclared change of {what} {patch.owner!r}")

    def callback(self, fn: Callable[..., Any], *args: Any) -> None:
        """Something else to undo with the patches (in the same last-first order)."""
        self._stack.callback(fn, *args)

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> "PatchSet":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_LISTENERS: dict[Patch, list[tuple[frozenset, Callable[[str, tuple], None]]]] = {}   # innermost last
_LISTENED: set[str] = set()   # the events any listener hears (the hook's fast test: it sees every event)
_AUDIT_HOOKED: list[bool] = []


def _on_audit_event(event: str, args: tuple) -> None:
    if not _LISTENED or event not in _LISTENED:   # (None while the interpreter tears the module down:
        return                                    # the hook, which cannot be removed, still hears events)
    for listeners in list(_LISTENERS.values()):
        if listeners and event in listeners[-1][0]:
            try:
                listeners[-1][1](event, args)
            except Exception:   # noqa: BLE001 (see PatchSet.listen)
                pass


def _stop_listening(patch: Patch, entry: tuple) -> None:
    _LISTENERS[patch].remove(entry)
    _listened_events_changed()


def _listened_events_changed() -> None:
    _LISTENED.clear()
    for listeners in _LISTENERS.values():
        for events, _ in listeners:
            _LISTENED.update(events)


def still_patched(applied: list[tuple[Patch, Any, str, Any]]) -> list[str]:
    """Of the changes closed PatchSets made (in order), those not undone: what each touched
    attribute holds now is not what it held before the first change to it (for tests; empty when
    everything was put back)."""
    first: dict[tuple[int, str], tuple[Patch, Any, str, Any]] = {}
    for entry in applied:
        first.setdefault((id(entry[1]), entry[2]), entry)
    out = []
    for patch, obj, name, before in first.values():
        if obj is os.environ:   # a variable's value is a new string on each read: compared by value
            changed = os.environ.get(name, _MISSING) != before
        else:
            changed = _own_value(obj, name) is not before
        if changed:
            out.append(f"{patch.owner}.{name} (declared by {patch.by})")
    return out


def markdown_table() -> str:
    """CATALOGUE as the markdown table docs/predict.md shows (attributes sharing a reason on one row)."""
    rows: dict[tuple[str, str, str], list[str]] = {}
    for p in CATALOGUE:
        rows.setdefault((p.by, p.owner, p.why), []).append(p.attribute)
    lines = ["| module | patched | attributes | why |", "|---|---|---|---|"]
    for (by, owner, why), names in sorted(rows.items()):
        shown = ", ".join(f"`{n}`" for n in names) if len(names) <= 6 else \
            ", ".join(f"`{n}`" for n in names[:6]) + f" and {len(names) - 6} more"
        lines.append(f"| `{by}` | `{owner}` | {shown} | {why} |")
    return "\n".join(lines)
