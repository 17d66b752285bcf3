"""The `amem` command: one module per command, one parser helper (parser.py), one entry (main.py)."""
from .main import main

__all__ = ["main"]
