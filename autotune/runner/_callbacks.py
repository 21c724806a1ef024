"""Extra ``TrainerCallback`` classes named ``module:attr`` (fault injection in tests, user probes)."""

from __future__ import annotations

import importlib

from autotune.errors import AutotuneError


def load_callback(name: str) -> type:
    """Import the ``TrainerCallback`` class that ``module:attr`` names.

    The orchestrator calls this once before a search, so a wrong name fails there with one line
    instead of failing every trial; each child calls it again to build the callback.

    Raises:
        AutotuneError: The name is malformed, the module cannot be imported, or the attribute is
            not a ``TrainerCallback`` class.
    """
    from transformers import TrainerCallback

    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        raise AutotuneError(f"--callback {name!r}: give it as module:Class (for example mypkg.probes:MyCallback)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AutotuneError(f"--callback {name!r}: cannot import {module_name} ({exc}); is it on PYTHONPATH?") from None
    callback = getattr(module, attr, None)
    if not (isinstance(callback, type) and issubclass(callback, TrainerCallback)):
        raise AutotuneError(f"--callback {name!r}: {module_name} has no TrainerCallback class named {attr}")
    return callback
