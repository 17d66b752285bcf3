"""Whose failure ends a predicted script: the user's (their traceback and exit status, as Python
shows them: user_script.py) or amem's (one line, exit status 4: "amem predict: cannot model <what>
at <user file:line> (<library file:line>); please report it").

Design note
-----------
A prediction runs the user's script on fake CUDA tensors (meta tensors that say "cuda") with
amem's code inside every torch call. An exception that ends the script can therefore be amem's
although it surfaces at the user's line: amem's own code failed, or torch failed because what it
was handed is fake (it cannot copy data out of a meta tensor, a meta kernel is missing, a call
reached the real CUDA driver). The user must not read "the script failed" then: their program is
not broken, amem is. Which it is follows from the exception alone, by these rules:

1. The chain. The exception is amem's when any exception of its chain is (itself, then what it
   was raised from, `__cause__`, and what it was raised while handling, `__context__`): a library
   or a script that catches amem's failure and raises its own does not make it the user's. The
   line names that one. An exception met only as a context counts by its signature (rule 8), not
   for where it was raised (rules 5 and 7): amem raises and handles exceptions of its own as
   control flow (meta_cache's _Unhashable), and the user's error raised inside such a handler
   (the meta kernel run there) carries one as its context.
2. Only an `Exception` can be amem's: Ctrl-C (KeyboardInterrupt, wherever it lands), SystemExit and
   the prediction's own stops (StopPrediction, PredictionTimeout) are BaseExceptions. amem's
   deliberate errors are passed over: NotModelledError and DataDependentError (the caller names
   them: they have their own line and status), and what amem raises on purpose for the script to
   see, as torch would raise it for the same call (user_script.for_the_script: an invalid device
   id, no SDPA kernel for the inputs).
3. A TypeError or AttributeError naming one of amem's stand-in types ("'FakeStream' object does
   not support the context manager protocol") is amem's wherever it is raised, the user's own
   line included: the object is amem's, and torch's own object takes that line (STAND_IN_TYPES,
   filled by the classes' modules with `stand_in`).
4. The raising frame is the innermost frame of the exception's traceback. It raised the exception
   itself (a `raise`, a failed subscript or attribute) unless its last instruction is a call: then
   a callee without a Python frame raised it (torch's C++).
5. Raised by amem's own code (an amem_alloc frame that raised it itself): amem's. A KeyError or an
   AttributeError there is amem's bug, whatever the script did.
6. Raised by the user's own code (a frame of the user's files that raised it itself): the user's,
   whatever it says (`raise RuntimeError("... meta ...")` in train.py is theirs).
7. Raised inside the replay of a compiled graph (below a frame of inductor's generated wrapper as
   amem runs it, `<inductor_wrapper_...>`, or of engine/graph_runner.py): amem's. Nothing of the
   user's runs there, only the graph's ops, and torch's own trace of that graph succeeded.
8. Otherwise (torch or another library raised it, or torch's C++ below a user or amem frame): amem's
   when its message matches a signature of fake execution (SIGNATURES, below: each says why only
   fake execution produces it), else the user's. A shape mismatch, a TypeError in a torch call, a
   user's dict's KeyError match none. Two narrowings keep a user's own mistake theirs: a signature
   that the user's own meta tensors would also raise on a GPU (`meta`) counts only while the
   script holds no meta tensors of its own; one that torch raises only when amem asks (`amem_call`:
   the storage of a vmap or sparse tensor, which the user's own code could ask for and fail on a GPU
   too) counts only when the raising frame is amem's.

Known limits. A device check naming meta can come from a fake tensor meeting a 0-dim CPU tensor
(amem moves larger CPU tensors onto the fake device) in an op whose CUDA kernel refuses a CPU
scalar too (take_along_dim, index_fill_): a GPU would fail there as well, and the line calls it
amem's. A call amem's code makes into torch's C++ with a bad argument of its own, failing with a
message that is no signature, reads as the user's: amem cannot tell it from the user's own call
that amem passes on (`func(*args, **kwargs)`), which is by far the more common; both directions
are rare, and this one at least shows the traceback.
"""
from __future__ import annotations

import dis
import os
import re
from dataclasses import dataclass
from typing import Callable

import torch

from .. import user_script
from ..code_files import _AMEM_DIR, _PLUMBING, _STDLIB, display_path, is_user_file, short_path

STAND_IN_TYPES: set[str] = set()   # names of amem's objects handed to the script in place of torch's


def stand_in(cls: type) -> type:
    """Class decorator: instances stand in for torch's objects (rule 3 of the module's note)."""
    STAND_IN_TYPES.add(cls.__name__)
    return cls


@dataclass(frozen=True)
class Signature:
    pattern: re.Pattern
    meta: bool = True          # a user's own meta tensors raise it on a GPU too: counts only when they hold none
    amem_call: bool = False    # counts only when amem's frame made the call that raised it


def _sig(pattern: str, meta: bool = True, amem_call: bool = False) -> Signature:
    return Signature(re.compile(pattern, re.IGNORECASE), meta, amem_call)


# What torch says only when it is handed fake tensors, or when a call escapes the fakes.
SIGNATURES = (
    # A read of a meta tensor's data (pickling a fake CUDA tensor, copying it into a real one):
    # meta tensors have no data; a CUDA tensor's copy to the host works.
    _sig(r"Cannot copy out of meta tensor"),
    # clip_grad_norm_/clip_grad_value_(foreach=True) group tensors by their real device (C++
    # _group_tensors_by_device_and_dtype), meta for fake CUDA tensors; CUDA has foreach kernels.
    _sig(r"can't use the foreach API on meta tensors"),
    # DLPack exports no meta tensor; a CUDA tensor exports.
    _sig(r"Cannot pack tensors on meta"),
    # An op with no meta kernel ("no fake impl or Meta kernel registered", "Could not run ... with
    # arguments from the 'Meta' backend"): on CUDA its kernel runs.
    _sig(r"no fake impl or Meta kernel|from the 'Meta' backend"),
    # A device check that finds a tensor on meta ("... on the same device, but found at least two
    # devices, meta and cpu", "Tensor on device meta is not on the expected device cpu", "Expected
    # tensor to have meta Device"): the meta tensor is a fake CUDA one, met with a CPU scalar tensor
    # in a meta implementation that refuses it where CUDA's kernel takes it (copysign's). Not any
    # message with both words: torch.device("cudaa") lists meta among the device types it knows,
    # and "meta-llama/..." is a model's name.
    _sig(r"same device\b.*\bmeta\b(?![-/'])|\bdevice meta\b|expected device meta\b|have meta Device"),
    # torch._refs.masked_fill's check of a tensor value's device, run only for meta tensors (CUDA's
    # kernel takes a 0-dim CPU value).
    _sig(r"Expected `value` to be on same device as `a`"),
    # amem's code asking a vmap/functorch wrapper, a sparse or a nested tensor for its storage:
    # they have none, and torch's own code does not ask.
    _sig(r"Cannot access storage of \w+", meta=False, amem_call=True),
    # torch.distributed.pipelining's refusal to infer a stage's shapes across the ranks of a fake
    # process group (prediction's; the GPU's real group exchanges them).
    _sig(r"not supported with a fake process group", meta=False),
    # The real CUDA driver reached: prediction answers torch.cuda itself, on a machine with no
    # usable GPU (or a torch without CUDA); on the GPU the script is for, the call works.
    _sig(r"Found no NVIDIA driver|CUDA driver version is insufficient|no CUDA-capable device is detected|"
         r"No CUDA GPUs are available|Torch not compiled with CUDA enabled|CUDA driver initialization failed",
         meta=False),
)


class AmemFailure(Exception):
    """amem failed inside the user's script (see the module's note): str() is the one line, without
    the command's name; `details` the script's traceback with amem's frames (for --debug). Plain
    strings only, so a distributed rank's worker process can hand it back."""

    def __init__(self, line: str, details: str = "") -> None:
        super().__init__(line)
        self.details = details


def amems_failure(err: BaseException, folder: str | None, deliberate: tuple = (),
                  user_meta: Callable[[], bool] = lambda: False) -> AmemFailure | None:
    """The AmemFailure that `err`, ending the script, is (None: it is the script's own error).
    folder: the script's, for the line's paths; deliberate: amem's own error types that are not its
    failures; user_meta(): whether the script holds meta tensors of its own now."""
    culprit = next((e for e, implicit in _chain(err) if _is_amems(e, deliberate, user_meta, implicit)), None)
    if culprit is None:
        return None
    return AmemFailure(line(culprit, err, folder), user_script.script_traceback(err))


def line(culprit: BaseException, err: BaseException, folder: str | None) -> str:
    """"cannot model <what> at <user file:line> (<library file:line>); please report it"."""
    user, library = _sites(culprit, err, folder)
    where = f" at {user} ({library})" if user and library else f" at {user or library}" if user or library else ""
    return f"cannot model {what(culprit)}{where}; please report it"


# ============================================================================ which exception
def _chain(err: BaseException) -> list[tuple[BaseException, bool]]:
    """(exception, met only as a context) for err, then what it was raised from or while handling,
    breadth first, causes before contexts (bounded, no cycles)."""
    out, todo, seen = [], [(err, False)], set()
    while todo and len(out) < 16:
        e, implicit = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        out.append((e, implicit))
        todo += [(e.__cause__, implicit), (e.__context__, True)]
    return out


def _is_amems(e: BaseException, deliberate: tuple, user_meta: Callable[[], bool], implicit: bool = False) -> bool:
    """Rules 2 to 8 of the module's note, for one exception of the chain (`implicit`: met only as
    a context, rule 1)."""
    if not isinstance(e, Exception) or isinstance(e, deliberate) or user_script.is_for_the_script(e):
        return False
    if _names_a_stand_in(e):
        return True
    tb = _innermost(e.__traceback__)
    if tb is None:
        return False
    owner = _owner(tb.tb_frame.f_code.co_filename)
    by_callee = _raised_by_callee(tb.tb_frame.f_code, tb.tb_lasti)
    if not by_callee and owner in ("amem", "user"):
        return owner == "amem" and not implicit
    if not implicit and _in_compiled_replay(e.__traceback__):
        return True
    sig = _signature(e)
    if sig is None or (sig.amem_call and owner != "amem"):
        return False
    return not (sig.meta and user_meta())


_OBJECT_OF_TYPE = re.compile(r"'(\w+)' object\b")


def _names_a_stand_in(e: BaseException) -> bool:
    """Rule 3: Python's "'<type>' object ..." of one of amem's stand-in types."""
    if not isinstance(e, (TypeError, AttributeError)):
        return False
    return any(name in STAND_IN_TYPES for name in _OBJECT_OF_TYPE.findall(str(e)))


_GRAPH_RUNNER = os.path.join(_AMEM_DIR, "predict", "engine", "graph_runner.py")


def _in_compiled_replay(tb) -> bool:
    """Rule 7: a frame of a compiled graph's replay on the way to where it was raised."""
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name.startswith("<inductor_wrapper_") or name == _GRAPH_RUNNER:
            return True
        tb = tb.tb_next
    return False


def _signature(e: BaseException) -> Signature | None:
    text = str(e)
    return next((s for s in SIGNATURES if s.pattern.search(text)), None)


def _innermost(tb):
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb


def _owner(filename: str) -> str:
    """"amem", "user" or "library" (torch, site-packages, the standard library, generated code)."""
    if filename.startswith(_AMEM_DIR + os.sep):
        return "amem"
    return "user" if is_user_file(filename) else "library"


def _raised_by_callee(code, lasti: int) -> bool:
    """Whether the instruction at `lasti` is a call (CALL, PRECALL, CALL_FUNCTION_EX, ...): the
    exception came from a callee with no Python frame, not from the frame's own code."""
    for ins in dis.get_instructions(code):
        if ins.offset == lasti:
            return ins.opname.startswith(("CALL", "PRECALL"))
    return False


# ============================================================================ what the line says
_SENTENCE_END = re.compile(r"(?<=[\w)\]'\"])\. (?=[A-Z])")
_LONGEST = 160


def what(e: BaseException) -> str:
    """The exception's type and the first line of its message, shortened to its first sentence."""
    kind = type(e)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    text = str(e).strip()
    first = _SENTENCE_END.split(text.splitlines()[0].strip(), maxsplit=1)[0] if text else ""
    first = first[:-1] if first.endswith(".") and not first.endswith("..") else first
    if len(first) > _LONGEST:
        first = first[:_LONGEST - 3].rstrip() + "..."
    return f"{name}: {first}" if first else name


def _frames(e: BaseException) -> list[tuple[str, int]]:
    out, tb = [], e.__traceback__
    while tb is not None:
        out.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    return out


# torch's own checks (torch._check, torch._check_with) say no more than the message they raise
_TORCH_CHECKS = os.path.join(os.path.dirname(torch.__file__), "__init__.py")


def is_library_line(filename: str) -> bool:
    """A frame worth naming as the library's line (notes.call_site's rule): not amem's, the user's,
    the standard library's, torch's plumbing between calls or its checks, or generated code."""
    return not (is_user_file(filename) or filename == _TORCH_CHECKS
                or filename.startswith((_AMEM_DIR, *_STDLIB, *_PLUMBING, "<")))


def _sites(culprit: BaseException, err: BaseException, folder: str | None) -> tuple[str | None, str | None]:
    """(the innermost user frame, the innermost library frame) as the output shows them; the user's
    from the script's exception when amem's failure was caught where no user frame shows."""
    frames = _frames(culprit)
    users = [f for f in frames if is_user_file(f[0])] or [f for f in _frames(err) if is_user_file(f[0])]
    libraries = [f for f in frames if is_library_line(f[0])]
    user = f"{display_path(users[-1][0], folder)}:{users[-1][1]}" if users else None
    library = f"{short_path(libraries[-1][0])}:{libraries[-1][1]}" if libraries else None
    return user, library
