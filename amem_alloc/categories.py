"""What a storage is — its category — and how the verdict groups categories: one table, here.

The Tracer's classifier (provenance/classify.py) gives each storage one of the profiler's
categories; prediction adds its own four (a kernel's workspace, FSDP's gathered parameters, a KV
cache, and unknown); the verdict (predict/analysis/verdict.py) sums them into groups, which report/ draws
(each group's colour and letter are report/verdict.py's, not here).
"""
from __future__ import annotations

import enum


class Category(str, enum.Enum):
    """A storage's category; each compares equal to its string (the JSON and traces carry strings)."""
    PARAMETER = "parameter"
    GRADIENT = "gradient"
    OPTIMIZER_STATE = "optimizer_state"
    INPUT = "input"
    ACTIVATION = "activation"
    TEMPORARY = "temporary"
    AUTOGRAD_DETAIL = "autograd_detail"
    BUFFER = "buffer"                          # a module's buffer (model state that is no parameter)
    WORKSPACE = "workspace"                    # a kernel's own memory (cuBLAS's workspace)
    KV_CACHE = "kv_cache"                      # an inference KV cache's keys and values (transformers' Cache)
    PARAMETER_GATHERED = "parameter (gathered)"  # FSDP's unsharded parameters
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value


# The Tracer's categories (the profiler's), in its order.
TRACER_CATEGORIES = tuple(c.value for c in (Category.PARAMETER, Category.GRADIENT, Category.OPTIMIZER_STATE,
                                             Category.INPUT, Category.ACTIVATION, Category.TEMPORARY,
                                             Category.AUTOGRAD_DETAIL))

# The verdict's groups, in the order they fill a bar: (label, the categories it holds). None: every
# category no other group names; (): filled otherwise (autocast's copies by the storages its casts
# made, cached but free by peak reserved less allocated).
GROUPS: tuple[tuple[str, tuple[str, ...] | None], ...] = (
    ("parameters", (Category.PARAMETER.value, Category.PARAMETER_GATHERED.value, Category.BUFFER.value)),
    ("gradients", (Category.GRADIENT.value,)),
    ("optimizer state", (Category.OPTIMIZER_STATE.value,)),
    ("activations", (Category.ACTIVATION.value, Category.AUTOGRAD_DETAIL.value)),
    ("KV cache", (Category.KV_CACHE.value,)),
    ("autocast copies", ()),
    ("temporaries", None),
    ("workspaces", (Category.WORKSPACE.value,)),
    ("cached but free", ()),
)
DEFAULT_GROUP = "temporaries"


def group_of(category: str) -> str:
    """The verdict's group of a category."""
    for label, cats in GROUPS:
        if cats and category in cats:
            return label
    return DEFAULT_GROUP
