"""A Python script of scripts/ (run there as a file, not importable as a package), loaded from its path."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.support.cli import REPO

SCRIPTS = REPO / "scripts"


def script(name: str) -> ModuleType:
    """scripts/NAME.py as a module."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # where dataclasses look up a class's module (its annotations are strings)
    # As when run as a file: its own directory first on sys.path, where it imports its siblings from.
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPTS))
    return module
