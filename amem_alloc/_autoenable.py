"""Run at interpreter start-up (through amem_alloc_autoenable.pth) when AMEM_ENABLE is set."""
import sys


def _autoenable() -> None:
    try:
        from .cuda import enable

        enable()
    except Exception as err:  # never break the interpreter's start-up; say why instead
        print(f"amem: AMEM_ENABLE is set but amem could not be enabled: {err}", file=sys.stderr)


_autoenable()
