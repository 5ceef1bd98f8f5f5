"""Lazy re-exports (PEP 562) for packages whose names live in modules that import torch."""

from __future__ import annotations

import importlib
import sys


def lazy_exports(package: str, names: dict[str, str]):
    """``(__getattr__, __dir__)`` for ``package`` re-exporting each of ``names`` (name → module) on first use,
    so that importing the package (and checking a command's arguments through it) stays free of torch."""

    def __getattr__(name: str):
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__
