"""GPU tests: skipped cleanly where torch sees no CUDA device (CI, laptops)."""
import pytest

torch = pytest.importorskip("torch")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device: torch.cuda.is_available() is False")
    for item in items:
        item.add_marker(skip)
