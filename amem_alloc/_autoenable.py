"""Run at interpreter start-up (through amem_alloc_autoenable.pth) when AMEM_ENABLE is set.

AMEM_ENABLE=1 makes amem torch's CUDA allocator before any user code runs; 0 (or empty) leaves
torch's. Any other value, or a failure to enable (a bad AMEM_CONF or AMEM_TRACE), stops the
process with one line and exit status 1 (Python's for an error at start-up; `amem run` says the
same line with 2, the commands' status for bad input) rather than run the script on an allocator
the user did not ask for.
"""
import os
import sys

VALUES = ("0", "1")


def _fail(message: str) -> None:
    sys.stderr.write(f"amem: {message}\n")
    sys.stderr.flush()
    os._exit(1)  # at start-up a SystemExit would be reported as a broken site module


def _autoenable() -> None:
    value = os.environ.get("AMEM_ENABLE", "").strip()
    if value in ("", "0"):
        return
    if value != "1":
        _fail(f"AMEM_ENABLE={value!r}: use 1 to make amem torch's CUDA allocator, or 0 (or unset it) for torch's")
    try:
        from .cuda import enable

        enable()
    except Exception as err:  # noqa: BLE001 - amem's own failure at start-up: one line, then stop
        text = str(err).strip() or type(err).__name__
        _fail(f"AMEM_ENABLE=1 but amem could not be enabled: {text.removeprefix('amem: ')}; "
              "fix the setting or unset AMEM_ENABLE")


_autoenable()
