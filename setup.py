"""Build of amem_alloc: the C++ core and the extension amem_alloc._C, through CMake and Ninja.

`pip install --no-build-isolation -e .` (what `make setup` runs) configures CMakeLists.txt into
build/cmake-<python>, builds the `_C` target with Ninja and places it in amem_alloc/. It needs no
CUDA toolkit and links against neither CUDA nor torch (see CMakeLists.txt).
"""
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = Path(__file__).parent.resolve()
AUTOENABLE_PTH = "amem_alloc_autoenable.pth"


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        import pybind11

        out_dir = Path(self.get_ext_fullpath(ext.name)).parent.resolve()
        build_dir = ROOT / "build" / f"cmake-{sysconfig.get_config_var('SOABI')}"
        config = [
            "-G", "Ninja",
            f"-DAMEM_OUTPUT_DIR={out_dir}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            f"-DCMAKE_BUILD_TYPE={'Debug' if self.debug else 'Release'}",
        ]
        subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build_dir), *config], check=True)
        jobs = str(os.cpu_count() or 2)
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "_C", "-j", jobs], check=True)


class BuildPyWithAutoenable(build_py):
    """Also installs amem_alloc_autoenable.pth, which makes AMEM_ENABLE=1 work for any process."""

    def run(self):
        super().run()
        target = Path(self.build_lib) / AUTOENABLE_PTH
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text((ROOT / "amem_alloc" / AUTOENABLE_PTH).read_text())

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [str(Path(self.build_lib) / AUTOENABLE_PTH)]


setup(
    ext_modules=[CMakeExtension("amem_alloc._C")],
    cmdclass={"build_ext": CMakeBuild, "build_py": BuildPyWithAutoenable},
)
