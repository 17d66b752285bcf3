"""The built extension imports nothing of libstdc++'s iostreams.

An extension built with GCC 13 (the GPU machines' compiler) crashed inside
std::ostream::operator<<(double) whenever torch 2.11 had been imported first: every process
that enabled amem died with SIGSEGV in options formatting (H100, torch 2.11.0+cu130, Python
3.12, 2026-11-23). The core formats with snprintf/to_chars instead; this test keeps iostreams
(and the process-wide locale machinery they drag in) out of the module for good.
"""
import shutil
import subprocess

import pytest

from amem_alloc import _C

IOSTREAM_SYMBOLS = ("std::basic_ostream", "std::ostream", "std::basic_istream", "std::ios_base",
                    "std::locale", "basic_stringbuf", "basic_ostringstream", "basic_stringstream")


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils)")
def test_extension_uses_no_iostreams():
    out = subprocess.run(["nm", "-DC", "--undefined-only", _C.__file__], capture_output=True, text=True,
                         check=True).stdout
    used = sorted({line.split(maxsplit=1)[-1] for line in out.splitlines()
                   if any(name in line for name in IOSTREAM_SYMBOLS)})
    assert not used, f"{_C.__file__} imports iostream symbols: {used}"


def test_options_format_fractions_as_printf_g():
    from amem_alloc.config import canonical

    assert "garbage_collection_threshold:0.85" in canonical("garbage_collection_threshold:0.85")
    assert "garbage_collection_threshold:0," in canonical("")
