"""An optimizer step inside a compiled region, with the memory inductor's compiled step takes.

dynamo traces `optimizer.step()` with `capturable=True` (torch/_dynamo/variables/optimizer.py
`_set_capturable`): the state is made at the first step, on the GPU (`step` included, one fp32
element per parameter); inductor then fuses the foreach update into kernels that write the
parameters and state in place, so the step allocates nothing beyond that state — none of the
parameter-sized temporaries eager foreach ops make (`_foreach_sqrt`, `_foreach_div` and the like).

The trace here cannot run an optimizer step (compile_inputs.py), so the step runs eager, and its
memory is made the compiled step's by running it as torch's fused kernel for the optimizers that
have one (Adam, AdamW, SGD: `fused=True` updates in place, with the same state), for this step
only; any other optimizer runs its own eager step, and a note says its temporaries are counted.
"""
from __future__ import annotations

import contextlib

from .. import notes as notes_mod

FUSABLE = ("Adam", "AdamW", "SGD")   # torch.optim's optimizers with a fused CUDA kernel
UNFUSED_NOTE = ("{name}.step() inside a compiled region: its eager foreach temporaries are counted (inductor fuses "
                "them away; no fused kernel to stand in for it here)")


@contextlib.contextmanager
def as_compiled_steps():
    """While it is open, every optimizer step runs as inductor's fused, in-place step would."""
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    saved: dict = {}

    def pre(optimizer, args, kwargs):
        if type(optimizer).__name__ not in FUSABLE or not all("fused" in g for g in optimizer.param_groups):
            notes_mod.record(notes_mod.ESTIMATE, UNFUSED_NOTE.format(name=type(optimizer).__name__))
            return
        saved[id(optimizer)] = [(g["fused"], g.get("foreach")) for g in optimizer.param_groups]
        for g in optimizer.param_groups:
            g["fused"], g["foreach"] = True, False

    def post(optimizer, args, kwargs):
        for g, (fused, foreach) in zip(optimizer.param_groups, saved.pop(id(optimizer), ())):
            g["fused"], g["foreach"] = fused, foreach

    handles = [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
