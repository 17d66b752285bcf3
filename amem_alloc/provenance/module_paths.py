"""Module paths ("layers.3.fc1"; "" is the model, None is code outside it) in a reader's order."""
from __future__ import annotations


def module_order(path):
    """Sort key: the model first, then module paths in natural order (layers.2 before layers.10),
    code outside the model last."""
    if path is None:
        return (1, ())
    return (0, tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in path.split(".")) if path else ())
