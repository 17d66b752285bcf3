"""The package's version: a leaf module, so a sub-package never imports amem_alloc/__init__ for it."""
__version__ = "0.1.0"
