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


@pytest.fixture(autouse=True, scope="session")
def _amems_files_of_the_session(tmp_path_factory):
    """Predictions read amem doctor --calibrate's file where it exists ($AMEM_CALIBRATION, else
    ~/.cache/amem_alloc/calibration.json), and compiled predictions keep inductor's wrappers
    ($AMEM_COMPILE_CACHE, else ~/.cache/amem_alloc/inductor): the tests use the session's own
    folder for both, never a developer's, so that a developer's calibration does not change what
    they see and a graph predicted twice in the session is read back as a user's second prediction
    reads it. Session-wide, before any other fixture: a module's fixture that runs a program
    (torchtitan's) sees them too, as do the children the tests start (helpers.environment_without_amem)."""
    base = tmp_path_factory.getbasetemp()
    with pytest.MonkeyPatch.context() as patch:
        if "AMEM_CALIBRATION" not in os.environ:
            patch.setenv("AMEM_CALIBRATION", str(base / "no-calibration.json"))
        if "AMEM_COMPILE_CACHE" not in os.environ:
            patch.setenv("AMEM_COMPILE_CACHE", str(base / "wrapper-cache"))
        yield
