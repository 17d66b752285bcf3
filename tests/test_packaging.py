"""What `pip install amem_alloc` gives a user, checked without building the extension (seconds; CI):
the metadata (version from amem_alloc/version.py, the dependencies and extras), every third-party
import the package makes declared or optional, and an sdist that carries what its build reads.
The wheel itself, built and installed beside a CPU-only and a CUDA torch, is tests/test_wheel.py
(slow)."""
from __future__ import annotations

import ast
import email
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from helpers import ROOT

import amem_alloc

# Third-party modules the package imports only where one option needs them, each with what happens
# without it. Anything else it imports must be a declared dependency.
OPTIONAL = {
    "matplotlib": "the extra `plots`: --plot and compare.png say in one line to install amem_alloc[plots]",
    "tqdm": "amem compare's progress bar on a terminal; without it no bar",
    "pynvml": "amem doctor --calibrate's NVML figures on a GPU; without it they are left out",
    "transformers": "generate()'s decode loop written out (predict/decode_loop.py), imported only once the "
                    "user's script has imported transformers' generation",
    "triton": "the program's own Triton launches stood in for (predict/engine/triton_launches.py), imported only "
              "where Triton is installed (torch's CUDA wheels bring it); without it there is nothing to stand in for",
    "safetensors": "a safetensors file saved from fake tensors holds zeros (predict/engine/safetensors_files.py), "
                   "patched only where safetensors is installed; without it no program saves one",
    "accelerate": "`amem predict -- accelerate launch ...` is decided by Accelerate's own launcher code "
                  "(predict/distributed/accelerate_launcher.py); without it that command says in one line to "
                  "install accelerate",
}


def _metadata(tmp_path: Path) -> email.message.Message:
    """The wheel's METADATA, as setuptools writes it (prepare_metadata_for_build_wheel: no build)."""
    code = ("from setuptools import build_meta; "
            f"print(build_meta.prepare_metadata_for_build_wheel({str(tmp_path)!r}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path / proc.stdout.strip().splitlines()[-1]
    return email.message_from_string((folder / "METADATA").read_text())


def _requirement_name(text: str) -> str:
    return re.split(r"[\s<>=!~;\[]", text.strip().strip('"'), maxsplit=1)[0].lower().replace("_", "-")


@pytest.fixture(scope="module")
def metadata(tmp_path_factory) -> email.message.Message:
    pytest.importorskip("setuptools")
    return _metadata(tmp_path_factory.mktemp("metadata"))


def test_the_version_is_the_one_in_version_py(metadata):
    assert metadata["Name"] == "amem_alloc"
    assert metadata["Version"] == amem_alloc.__version__, (metadata["Version"], amem_alloc.__version__)


def test_base_dependencies_and_extras(metadata):
    requires = metadata.get_all("Requires-Dist")
    base = [r for r in requires if "extra ==" not in r]
    assert sorted(base) == ["numpy", "torch>=2.11"], base
    extras = {e: sorted(_requirement_name(r) for r in requires if f'extra == "{e}"' in r)
              for e in metadata.get_all("Provides-Extra")}
    assert extras["plots"] == ["matplotlib"]
    assert extras["test"] == ["hypothesis", "pytest"]
    assert "torchvision" in extras["programs"] and "transformers" in extras["programs"]
    assert metadata["Requires-Python"] == ">=3.10"


def test_the_amem_command_starts_outside_the_package(tmp_path):
    """The console script is amem_command.main, a module of its own beside the package (py-modules), so
    Ctrl-C while the package imports is one line (tests/test_cli_interrupts.py)."""
    pytest.importorskip("setuptools")
    code = ("from setuptools import build_meta; "
            f"print(build_meta.prepare_metadata_for_build_wheel({str(tmp_path)!r}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    points = (tmp_path / proc.stdout.strip().splitlines()[-1] / "entry_points.txt").read_text()
    assert "amem = amem_command:main" in points.splitlines()
    imports = [m for m, _ in _imports(ROOT / "amem_command.py")]
    assert "amem_alloc" in imports and set(imports) <= {"amem_alloc", "sys"}


def test_the_programs_extra_names_the_makefiles_program_libraries(metadata):
    """make setup installs PROGRAM_LIBS (with torchvision pinned to its torch); the extra, for a user's
    own environment, must name the same libraries."""
    line = re.search(r"^PROGRAM_LIBS \?= ((?:.*\\\n)*.*)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    makefile = sorted(_requirement_name(r) for r in re.findall(r'"[^"]+"', line))
    extra = sorted(_requirement_name(r) for r in metadata.get_all("Requires-Dist") if 'extra == "programs"' in r)
    assert makefile == extra


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(top-level module, imported when the module itself is imported) for each absolute import."""
    tree = ast.parse(path.read_text(), str(path))
    at_import_time = {id(node) for node in tree.body}
    for node in tree.body:  # `if TYPE_CHECKING:`/`try:` at module scope still run at import
        if isinstance(node, (ast.If, ast.Try)):
            at_import_time |= {id(n) for n in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(n.split(".")[0], id(node) in at_import_time) for n in names]
    return found


def test_every_third_party_import_is_declared_or_optional(metadata):
    """A wheel once installed beside torch and stopped at `No module named 'numpy'`: the package
    imported what it did not declare. Now a new import must be added to pyproject.toml's
    dependencies, or to OPTIONAL above with what the user sees without it."""
    declared = {_requirement_name(r) for r in metadata.get_all("Requires-Dist") if "extra ==" not in r}
    stdlib = set(sys.stdlib_module_names)
    undeclared, optional_at_import = [], []
    for path in sorted((ROOT / "amem_alloc").rglob("*.py")):
        for module, at_import in _imports(path):
            if module in stdlib or module == "amem_alloc" or module in declared:
                continue
            where = str(path.relative_to(ROOT))
            if module not in OPTIONAL:
                undeclared.append(f"{where}: {module}")
            elif at_import:
                optional_at_import.append(f"{where}: {module}")
    assert undeclared == [], "declare these in pyproject.toml, or make them optional: " + ", ".join(undeclared)
    assert optional_at_import == [], "optional modules imported at module scope: " + ", ".join(optional_at_import)


def test_the_sdist_carries_what_the_build_reads(tmp_path):
    """The wheel of `python -m build` is built from the sdist: without CMakeLists.txt and csrc/ it
    failed there (CMake: no CMakeLists.txt)."""
    pytest.importorskip("setuptools")
    code = f"from setuptools import build_meta; print(build_meta.build_sdist({str(tmp_path)!r}))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sdist = tmp_path / proc.stdout.strip().splitlines()[-1]
    top = f"amem_alloc-{amem_alloc.__version__}/"
    names = {n.removeprefix(top) for n in tarfile.open(sdist).getnames()}
    cmake = (ROOT / "CMakeLists.txt").read_text()
    built_from = set(re.findall(r"\b(csrc/[\w/]+\.(?:cpp|h))\b", cmake))
    headers = {str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*.h")}
    needed = {"CMakeLists.txt", "setup.py", "pyproject.toml", "README.md", "CHANGELOG.md", "amem_command.py",
              "amem_alloc/amem_alloc_autoenable.pth", "amem_alloc/version.py",
              "amem_alloc/report/template.html", "amem_alloc/report/report.js", "amem_alloc/report/report.css"}
    assert len(built_from) > 20
    missing = sorted((needed | built_from | headers) - names)
    assert missing == [], missing
    assert not [n for n in names if n.endswith((".so", ".o", ".pyc"))], "build outputs in the sdist"
    assert not [n for n in names if n.startswith("tests/")], "tests without their helpers (MANIFEST.in prunes them)"

