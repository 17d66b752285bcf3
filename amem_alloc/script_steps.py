"""Counting a user's script's steps while it runs (`amem predict`'s and `amem compare`'s --steps):
its optimizer steps, or, where it made no optimizer, its backward passes.

Design note
-----------
A step is an optimizer's `step()` (torch.optim's global step hooks). A step taken inside another
(an optimizer container such as torchtitan's, itself an Optimizer, stepping its parts) is part of
that one. Steps taken during a backward pass (an optimizer per parameter, stepped by its gradient
hook: torchtune's `optimizer_in_bwd`) are one step, counted as that backward ends (autograd's
`queue_callback`). A script that has made no torch.optim optimizer when a backward pass ends (it
updates its parameters itself: PyTorch's word_language_model) counts that backward pass as its
step. The wrappers live here, apart from user_script.py, the script runner: the frames above the
runner are amem's command line, and a note made inside a backward must still find the user's
line through this module's frames.
"""
from __future__ import annotations

import contextlib
import dis
import inspect
import sys
from typing import Callable, Iterator

from .patching import PatchSet, declare
from .user_script import ScriptFailed, name_of, run, target_of

OPTIMIZER_MADE = declare("torch.optim.Optimizer", "__init__",
                        "while a script's steps are counted: whether it made an optimizer (without one, each "
                        "backward pass is a step)")
BACKWARD_PASS = declare("torch.autograd", "backward",
                        "while a script's steps are counted: a backward pass ends a step where the script made "
                        "no optimizer (it updates its parameters itself)")


def run_steps(argv: list[str], on_step=None, reraise: tuple = (), amems=None, on_backward_step=None) -> int:
    """Runs the script or module (user_script.run; argv as target_of reads it) and counts its steps
    (see the note), calling on_step(n) after the n-th and `on_backward_step()` before the first
    backward pass counted as a step; returns the count. ScriptFailed if it exits non-zero (its
    traceback is on stderr by then)."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    steps, depth, backward, made = [0], [0], [None], [False]   # backward: the pass whose end counts a step
    wrapper = _WrapperStep()

    def enter(optimizer, args, kwargs) -> None:
        depth[0] += 1

    def count(optimizer, args, kwargs) -> None:
        depth[0] = max(depth[0] - 1, 0)
        if depth[0]:
            return
        task = torch._C._current_graph_task_id()
        if task == -1:
            if not wrapper.takes_part(optimizer, counted):
                counted()
        elif backward[0] != task:
            backward[0] = task
            torch.autograd.Variable._execution_engine.queue_callback(counted)

    def counted() -> None:
        backward[0] = None
        steps[0] += 1
        if on_step is not None:
            on_step(steps[0])

    def backward_step() -> None:
        if on_backward_step is not None and not steps[0]:
            on_backward_step()
        counted()

    target, args, module = target_of(argv)
    failed_with: list[str] = []
    hooks = (register_optimizer_step_pre_hook(enter), register_optimizer_step_post_hook(count))
    try:
        with _backward_steps(made, backward_step, wrapper.backward_begins):
            status = run(target, args, module=module, reraise=reraise, amems=amems, failed_with=failed_with)
    finally:
        wrapper.unwatch()
        for hook in hooks:
            hook.remove()
    if status != 0:
        raise ScriptFailed(name_of(argv), status, failed_with[-1] if failed_with else None)
    return steps[0]


@contextlib.contextmanager
def _backward_steps(made: list, counted: Callable[[], None], begins: Callable[[], None]) -> Iterator[None]:
    """While the script runs: `made[0]` says whether it made an optimizer; a backward pass (not
    one nested in another) that ends with none made is a step, `counted()`; `begins()` before
    each."""
    import torch

    init, backward = torch.optim.Optimizer.__init__, torch.autograd.backward
    nested = [0]

    def optimizer_init(self, *args, **kwargs):
        made[0] = True
        return init(self, *args, **kwargs)

    def backward_pass(*args, **kwargs):
        begins()
        nested[0] += 1
        try:
            out = backward(*args, **kwargs)
        finally:
            nested[0] -= 1
        if not made[0] and not nested[0] and torch._C._current_graph_task_id() == -1:
            counted()
        return out
    with PatchSet() as patches:
        patches.apply(OPTIMIZER_MADE, torch.optim.Optimizer, "__init__", optimizer_init)
        patches.apply(BACKWARD_PASS, torch.autograd, "backward", backward_pass)
        yield


class _WrapperStep:
    """The step an object holding an optimizer takes of it from its own `step` method (see the
    note): the first of its optimizer steps starts watching that frame, the others are part of it,
    and the step is counted as it returns."""

    LOOKS_UP = 8   # frames above the optimizer's step searched for the holder's `step`
    _NOT_ONCE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR

    def __init__(self):
        self.frame = None       # the holder's `step` being watched
        self.on_return = None   # what its return calls (the count)

    def takes_part(self, optimizer, counted: Callable[[], None]) -> bool:
        """Whether this optimizer step is part of a holder's step (then counted as that returns)."""
        if self.frame is not None:
            return True
        frame = self._holders_step(optimizer)
        if frame is None or sys.getprofile() is not None:
            return False
        self.frame, self.on_return = frame, counted
        sys.setprofile(self._profile)
        return True

    def _holders_step(self, optimizer):
        import torch

        frame = sys._getframe(3)   # above this, count() and torch's step wrapper
        for _ in range(self.LOOKS_UP):
            if frame is None:
                return None
            code = frame.f_code
            if code.co_name == "step" and not code.co_flags & self._NOT_ONCE:
                owner = frame.f_locals.get("self")
                if owner is not None and not isinstance(owner, torch.optim.Optimizer) and _holds(owner, optimizer):
                    return frame
            frame = frame.f_back
        return None

    def _profile(self, frame, event, arg) -> None:
        if frame is self.frame and event == "return":
            if _returns(frame):
                self.finish()
            else:   # an exception leaves it: the script's own, which must go on as it is
                self.unwatch()

    def finish(self) -> None:
        """The watched step ends: counted (which may stop the script: its exception goes on from
        the holder's `step` to its caller)."""
        counted = self.on_return
        self.unwatch()
        if counted is not None:
            counted()

    def backward_begins(self) -> None:
        """A backward pass inside the watched frame: it is no single step; the step so far counts."""
        if self.frame is not None:
            self.finish()

    def unwatch(self) -> None:
        if self.frame is not None and sys.getprofile() == self._profile:
            sys.setprofile(None)
        self.frame = self.on_return = None


_RETURNS = {dis.opmap[name] for name in ("RETURN_VALUE", "RETURN_CONST") if name in dis.opmap}


def _returns(frame) -> bool:
    """Whether the frame's last instruction is a return (the profile's "return" event comes on an
    exception leaving it too)."""
    code = frame.f_code.co_code
    return 0 <= frame.f_lasti < len(code) and code[frame.f_lasti] in _RETURNS


def _holds(owner, optimizer) -> bool:
    try:
        return any(value is optimizer for value in vars(owner).values())
    except TypeError:   # no __dict__
        return False
