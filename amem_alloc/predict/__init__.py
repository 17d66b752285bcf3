"""Prediction: a training or inference step's GPU memory under every allocator policy, without a GPU.

    amem_alloc.predict(step_fn, gpu="H100-80GB")          # this module is callable: api.predict
    with amem_alloc.predicting(gpu="A100-40GB") as run: ...
    amem predict --gpu H100-80GB -- python train.py ...    # the CLI (amem_alloc/cli/predict.py)

The pipeline, one package per stage (data flows down; tests/test_architecture.py checks it):
engine/ runs code on fake CUDA tensors, following rules/ (what CUDA's kernels and autograd engine
do beyond the meta kernels); run.py is the run it records (one listener, one RecordedRun);
shims/ makes torch.cuda answer from the prediction while it runs; analysis/ evaluates the run per
policy (replay/evaluation.py: peaks, smallest capacity, fits) and says what holds memory (JSON and
trace; report/ makes the text and page from the JSON); whatif/ re-predicts with a change; api.py
and amem_alloc/cli/predict.py are the two ways in, fit.py and distributed/ run many predictions.
state.py holds a running session's state, notes.py what it stood in for, gpus.py the card table.
See docs/predict.md and docs/architecture.md. Submodules load on first use, so `amem --help` does
not pay for numpy and torch.
"""
from __future__ import annotations

import importlib
import sys
import types

_EXPORTS = {"predict": ".api", "predicting": ".api", "is_predicting": ".api", "resolve_gpu": ".api", "resolve_policies": ".api",
            "GPUS": ".gpus", "Gpu": ".gpus", "NOTE": ".analysis.prediction", "Prediction": ".analysis.prediction"}


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        from .api import predict

        return predict(*args, **kwargs)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    from ..user_script import for_the_script   # Python's own error for a missing name: the caller's

    raise for_the_script(AttributeError(f"module {__name__!r} has no attribute {name!r}"))


sys.modules[__name__].__class__ = _CallableModule

__all__ = sorted(_EXPORTS)
