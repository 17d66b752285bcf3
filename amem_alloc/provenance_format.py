"""The provenance JSON format (Tracer.to_dict()): its tag, its shape check, and how it names modules.

A leaf: the Tracer writes this format (amem_alloc/provenance), the report reads it
(amem_alloc/report/provenance.py) and `amem report --provenance` checks it (user_input.py), all
from here, so the tag is written once.
"""
from __future__ import annotations

from typing import Any

FORMAT_PREFIX = "amem_alloc.provenance/"
FORMAT = FORMAT_PREFIX + "1"


def is_provenance(data: Any) -> bool:
    """Whether `data` says it is a Tracer's JSON (the report then draws its own tables for it)."""
    return isinstance(data, dict) and str(data.get("format", "")).startswith(FORMAT_PREFIX)


def module_label(module) -> str:
    """A module path as the provenance tables show it (None: outside the model; "": the model)."""
    if module is None:
        return "(outside the model)"
    return module or "(model)"


_STEP_KEYS = {"step": int, "steps": int, "status": str, "message": str, "accounting": list, "total": dict,
              "modules": list, "saved": list}


def provenance_problem(data: Any) -> str | None:
    """Why `data` is not Tracer.to_dict()'s shape, or None."""
    if not isinstance(data, dict):
        return f"the top level is a JSON {type(data).__name__}, not an object"
    fmt = data.get("format")
    if not isinstance(fmt, str) or not fmt.startswith(FORMAT_PREFIX):
        return f"its \"format\" is {fmt!r}, not \"{FORMAT}\""
    steps = data.get("activations")
    if not isinstance(steps, list):
        return "no \"activations\" list"
    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            return f"activations[{i}] is not an object"
        for key, kind in _STEP_KEYS.items():
            if not isinstance(step.get(key), kind):
                return f"activations[{i}].{key} is missing or not a {kind.__name__}"
    return None
