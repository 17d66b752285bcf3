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

    def enter(optimizer, args, kwargs) -> None:
        depth[0] += 1

    def count(optimizer, args, kwargs) -> None:
        depth[0] = max(depth[0] - 1, 0)
        if depth[0]:
            return
        task = torch._C._current_graph_task_id()
        if task == -1:
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
        with _backward_steps(made, backward_step):
            status = run(target, args, module=module, reraise=reraise, amems=amems, failed_with=failed_with)
    finally:
        for hook in hooks:
            hook.remove()
    if status != 0:
        raise ScriptFailed(name_of(argv), status, failed_with[-1] if failed_with else None)
    return steps[0]


@contextlib.contextmanager
def _backward_steps(made: list, counted: Callable[[], None]) -> Iterator[None]:
    """While the script runs: `made[0]` says whether it made an optimizer; a backward pass (not
    one nested in another) that ends with none made is a step, `counted()`."""
    import torch

    init, backward = torch.optim.Optimizer.__init__, torch.autograd.backward
    nested = [0]

    def optimizer_init(self, *args, **kwargs):
        made[0] = True
        return init(self, *args, **kwargs)

    def backward_pass(*args, **kwargs):
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
