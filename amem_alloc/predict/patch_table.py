"""The table of every change amem makes to torch and other libraries (amem_alloc/patching.py's
CATALOGUE), with every declaring module loaded: what docs/predict.md shows.

    python -m amem_alloc.predict.patch_table
"""
from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from .. import patching


def markdown() -> str:
    """The catalogue as markdown, after importing every module that declares patches."""
    importlib.import_module("amem_alloc.torch_patch")
    for info in pkgutil.walk_packages([str(Path(__file__).parent)], __package__ + "."):
        if not info.name.endswith(".patch_table"):
            importlib.import_module(info.name)
    return patching.markdown_table()


if __name__ == "__main__":
    print(markdown())
