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
    """Also installs amem_alloc_autoenable.pth, which makes AMEM_ENABLE=1 work for any process.

    A wheel carries it from build_lib. An editable install (`pip install -e .`) copies nothing
    from build_lib: setuptools' editable_wheel builds its wheel from a folder (the install
    command's install_lib), so the file is written there too, and lands in site-packages beside
    the editable finder. Without it AMEM_ENABLE and AMEM_TRACE did nothing and said nothing.
    """

    def run(self):
        super().run()
        text = (ROOT / "amem_alloc" / AUTOENABLE_PTH).read_text()
        target = Path(self.build_lib) / AUTOENABLE_PTH
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        if getattr(self, "editable_mode", False):
            wheel_root = self.distribution.get_command_obj("install").install_lib
            if wheel_root and Path(wheel_root).is_dir():
                (Path(wheel_root) / AUTOENABLE_PTH).write_text(text)

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [str(Path(self.build_lib) / AUTOENABLE_PTH)]


setup(
    ext_modules=[CMakeExtension("amem_alloc._C")],
    cmdclass={"build_ext": CMakeBuild, "build_py": BuildPyWithAutoenable},
)
