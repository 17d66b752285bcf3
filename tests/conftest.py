"""Slow tests (marked `slow`) run only with --run-slow or AMEM_RUN_SLOW=1.

Ctrl-C reaches the tests as it reaches a program in a terminal: a suite started in the background
(`make test &`, nohup) inherits SIGINT ignored, and so would every process it starts, and the
tests that send SIGINT would wait for nothing. The suite takes Python's own handler, which its
children get back as the default on exec.
"""
import os
import signal

import pytest

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False, help="also run tests marked slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-slow") or os.environ.get("AMEM_RUN_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: run with --run-slow or AMEM_RUN_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_calibration_of_this_machine(monkeypatch, tmp_path_factory):
    """Predictions read amem doctor --calibrate's file where it exists ($AMEM_CALIBRATION, else
    ~/.cache/amem_alloc/calibration.json); a developer's own must not change what the tests see."""
    if "AMEM_CALIBRATION" not in os.environ:
        monkeypatch.setenv("AMEM_CALIBRATION", str(tmp_path_factory.getbasetemp() / "no-calibration.json"))


@pytest.fixture(autouse=True)
def _wrapper_cache_of_the_session(monkeypatch, tmp_path_factory):
    """Compiled predictions keep inductor's wrappers ($AMEM_COMPILE_CACHE, else ~/.cache/amem_alloc/
    inductor): the tests keep theirs in the session's own folder, never a developer's, and a graph
    predicted twice in the session is read back as a user's second prediction reads it."""
    if "AMEM_COMPILE_CACHE" not in os.environ:
        monkeypatch.setenv("AMEM_COMPILE_CACHE", str(tmp_path_factory.getbasetemp() / "wrapper-cache"))
