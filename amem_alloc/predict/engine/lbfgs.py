"""LBFGS under prediction: how often a step calls its closure, and how much history it keeps, follow
the loss's values, which no prediction computes.

Design note
-----------
torch.optim.LBFGS's `step(closure)` runs up to `max_iter` iterations, each calling the closure (a
forward and a backward), and keeps, where the curvature condition holds (`ys > 1e-10`), a pair of
flat vectors the size of all its parameters (`old_dirs`, `old_stps`), up to `history_size` pairs;
it stops early once the gradient, the step or the loss's change falls under its tolerances. Under
prediction those comparisons read stand-ins (values.py): a step stops within its first iterations
and keeps no history, so the figures can fall short by up to `history_size` pairs (pytorch/examples'
time_sequence_prediction: 2 closure calls a step instead of 20; a 16 MiB model with
history_size=100: 1.8 GiB of history after 3 real steps, none predicted). No rule here answers
those comparisons (each is a value of the model's loss surface), so each step says what it leaves
out, at the user's `step` line, with the largest history the optimizer may keep.
"""
from __future__ import annotations

import torch

from ...introspection import format_bytes
from .. import notes

LEFT_OUT = ("LBFGS: how many times a step calls its closure and how much history it keeps follow the loss's "
            "values, which a prediction does not compute: predicted as its stand-ins ran it (its first "
            "iterations, no history kept); a real step calls the closure up to max_iter={max_iter} times and "
            "the optimizer keeps up to history_size={history} pairs of vectors the size of its parameters: "
            "up to {most} more than predicted")


def note_step(optimizer) -> None:
    """After an optimizer step: where it was an LBFGS step, what the prediction leaves out, said."""
    if not isinstance(optimizer, torch.optim.LBFGS):
        return
    group = optimizer.param_groups[0]   # (LBFGS takes one parameter group)
    with torch._C.DisableTorchFunction():
        flat = sum(p.numel() * p.element_size() for p in group["params"])
    notes.record(notes.NOT_MODELLED, LEFT_OUT.format(max_iter=group["max_iter"], history=group["history_size"],
                                                     most=format_bytes(2 * group["history_size"] * flat)))
