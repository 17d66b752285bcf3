"""Prediction: a training or inference step's GPU memory under every allocator policy, without a GPU.

    amem_alloc.predict(step_fn, gpu="H100-80GB")          # this module is callable: api.predict
    with amem_alloc.predicting(gpu="A100-40GB") as run: ...
    amem predict --gpu H100-80GB -- python train.py ...    # the CLI (amem_alloc/cli/predict.py)

session.py runs code on fake CUDA tensors and records the allocation sequence; cuda_shims.py
makes torch.cuda answer from the prediction; outcome.py evaluates the sequence per policy
(replay/evaluation.py: peaks, smallest capacity, fits), says what holds memory at the peak and
writes the JSON, text and trace that report/predict.py draws its page from; verdict.py is the
verdict's data and text; gpus.py is the card table;
api.py and amem_alloc/cli/predict.py are the two ways in. See docs/predict.md. Submodules load on first use, so
`amem --help` does not pay for numpy and torch.
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
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


sys.modules[__name__].__class__ = _CallableModule

__all__ = sorted(_EXPORTS)
