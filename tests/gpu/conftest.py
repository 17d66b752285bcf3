"""GPU tests: skipped cleanly where torch sees no CUDA device (CI, laptops)."""
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    # This hook sees the whole session's items: mark only the tests under tests/gpu.
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device: torch.cuda.is_available() is False")
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)
