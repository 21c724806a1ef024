"""Figures that follow from a config and the installed libraries alone, kept on disk between processes.

A search's parent process would otherwise import transformers' modeling code and its arguments classes
only to count a model's parameters on the meta device and to read the trainer's defaults: about
3.5 s of CPU at every ``autotune search`` start on a 2-core machine (py-spy, docs/benchmarks.md "The
test suite"), for figures that change only with the config or the installed versions. Each entry is one
JSON file in ``$XDG_CACHE_HOME/autotune/derived/``, named by a hash of everything the figure depends on:
the caller's key, the installed torch, transformers and TRL, and the source of the module that computes
it (a changed rule is a new entry, never a stale one). Written whole or not at all (a temporary file
renamed over it); an unreadable entry is computed again.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from autotune.spec.files import autotune_cache_dir

T = TypeVar("T")

# What every entry depends on besides its own key.
_LIBRARIES = ("torch", "transformers", "trl")


def cache_dir() -> Path:
    """Where the entries live: the user's cache directory, beside ``peaks.json``."""
    return autotune_cache_dir() / "derived"


def cached(kind: str, key: Any, computing_module: str | tuple[str, ...], compute: Callable[[], T]) -> T:
    """``compute()``'s JSON-serialisable value for ``key``: read from disk, else computed and kept.

    Args:
        kind: What the figure is (the file name's prefix, for a reader of the directory).
        key: Everything the figure depends on besides the installed libraries (JSON-serialisable).
        computing_module: The path of the source file whose rules compute it (part of the key), or the
            paths of each file that holds some of them.
        compute: Computes the figure when no entry holds it.
    """
    path = cache_dir() / f"{kind}-{_digest(key, computing_module)}.json"
    with contextlib.suppress(OSError, ValueError):
        return json.loads(path.read_text())["value"]  # what compute() returned, as JSON gives it back
    value = compute()
    with contextlib.suppress(OSError, TypeError, ValueError):  # not kept: computed again next time
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": key, "value": value}, sort_keys=True))
        tmp.replace(path)
    return value


def _digest(key: Any, computing_module: str | tuple[str, ...]) -> str:
    parts = [json.dumps(key, sort_keys=True, default=str)]
    for package in _LIBRARIES:
        try:
            parts.append(f"{package}={importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{package}=absent")
    for module in (computing_module,) if isinstance(computing_module, str) else computing_module:
        parts.append(hashlib.sha256(Path(module).read_bytes()).hexdigest())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]
