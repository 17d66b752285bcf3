# amem_alloc — the commands the README gives. Each sets up what it needs first.
#
#   make demo     set up, build, and run the main job (sim backend without a GPU)
#   make test     set up, build, and run every test (Python and C++)
#
# Setup makes a virtual environment in .venv with a CUDA build of torch (pip takes it from this
# machine's local files), builds the extension in place, and installs GoogleTest for the C++ tests.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.14.1
CPP_BUILD := build/cpp-tests

.PHONY: setup build demo test test-python test-cpp test-gpu chromium clean

setup: $(VENV)/.ready build

$(VENV)/.ready: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)" numpy pybind11 ninja "cmake>=3.18" setuptools wheel pytest hypothesis
	$(PY) -m pip install -q --no-build-isolation --no-deps -e .
	@# An editable install carries packages only; a wheel install carries this file itself (setup.py).
	cp amem_alloc/amem_alloc_autoenable.pth "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"
	touch $@

build: $(VENV)/.ready
	$(PY) setup.py -q build_ext --inplace

demo: setup
	$(VENV)/bin/amem demo

test: setup test-python test-cpp

test-python: chromium
	$(PY) -m pytest -q tests

# The report's browser test loads the page in Debian's headless chromium (no download by the test).
chromium:
	@test -x /usr/bin/chromium || (apt-get update -qq && apt-get install -y -qq chromium)

test-gpu: setup
	$(PY) -m pytest -q tests/gpu

test-cpp:
	@test -f /usr/include/gtest/gtest.h || (apt-get update -qq && apt-get install -y -qq libgtest-dev)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" cmake -S . -B $(CPP_BUILD) -G Ninja -DAMEM_BUILD_TESTS=ON -DAMEM_BUILD_PYTHON=OFF
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" cmake --build $(CPP_BUILD)
	ctest --test-dir $(CPP_BUILD) --output-on-failure

clean:
	rm -rf build amem_alloc/_C*.so
