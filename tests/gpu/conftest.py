"""GPU tests: skipped cleanly where torch sees no CUDA device (CI, laptops).

With AMEM_GPU_ARTIFACTS set, every subprocess a GPU test runs (helpers.run_python / run_command)
leaves its exit status, stdout and stderr there, named after the test, and save_artifact() keeps
anything else a test measured or recorded, so a failed GPU run can be diagnosed offline."""
import functools
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import helpers  # noqa: E402


def pytest_collection_modifyitems(config, items):
    # This hook sees the whole session's items: mark only the tests under tests/gpu.
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device: torch.cuda.is_available() is False")
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)


def save_artifact(name, data):
    """Writes what a GPU test measured or recorded to $AMEM_GPU_ARTIFACTS/<name> (when that is set),
    so a failed GPU run can be diagnosed offline. `data`: str, bytes, or anything JSON can hold."""
    import json
    import os

    root = os.environ.get("AMEM_GPU_ARTIFACTS")
    if not root:
        return None
    path = Path(root) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    elif isinstance(data, str):
        path.write_text(data)
    else:
        path.write_text(json.dumps(data, indent=1, default=str))
    return path


_runs = {}


def _saving(run):
    @functools.wraps(run)
    def wrapper(*args, **kwargs):
        proc = run(*args, **kwargs)
        save_run(proc)
        return proc
    return wrapper


# Before the test modules import them (conftest is imported first).
helpers.run_python = _saving(helpers.run_python)
helpers.run_command = _saving(helpers.run_command)


def save_run(proc):
    """A subprocess run's exit status, stdout and stderr, under the current test's name."""
    import os
    import re

    test = os.environ.get("PYTEST_CURRENT_TEST", "run").split(" ")[0]
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", test)
    _runs[name] = _runs.get(name, 0) + 1
    return save_artifact(f"runs/{name}.{_runs[name]}.txt",
                         f"rc={proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
