"""Libraries that chatter: real packages on ``sys.path`` that print, warn and log when they are imported.

``write_chatty_library`` writes a new package; ``write_chatty_shadows`` writes, for an installed library
(``bitsandbytes``, ``peft``, ...), a package of the same name that chatters at import and then puts the
installed library in its own place (the import system returns ``sys.modules[name]`` once the package's
``__init__`` has run), so whatever imports it gets the real library, after the chatter. Put their directory
first on ``PYTHONPATH`` (or ``sys.path``).
"""

from __future__ import annotations

from pathlib import Path

_CHATTER = """\
import logging
import sys
import warnings

print("{name} prints on stdout at import")
print("{name} prints on stderr at import", file=sys.stderr)
warnings.warn("{name} warns at import", FutureWarning)
logging.getLogger("{name}.chatty").warning("{name} logs at import")  # no handler: Python's last resort, stderr
_own = logging.getLogger("{name}.chatty.own")  # a handler of its own, made at import (DeepSpeed's, transformers')
_own.addHandler(logging.StreamHandler())
_own.propagate = False
_own.warning("{name} logs through its own handler at import")


def speak():
    \"\"\"What the library says at run time, once imported.\"\"\"
    warnings.warn("{name} warns at run time", FutureWarning)
    logging.getLogger("{name}.chatty").warning("{name} logs at run time")
    _own.warning("{name} logs through its own handler at run time")
"""

_BECOME_THE_INSTALLED_ONE = """
import importlib.machinery
import importlib.util
import os

_shadows = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.machinery.PathFinder.find_spec(
    "{name}", [entry for entry in sys.path if os.path.abspath(entry or ".") != _shadows]
)
_installed = importlib.util.module_from_spec(_spec)
sys.modules["{name}"] = _installed
_spec.loader.exec_module(_installed)
"""


def chatter_lines(name: str, *, at_run_time: bool = False) -> list[str]:
    """What a chatty ``name`` says: each line, as it is printed, warned or logged."""
    when = "at run time" if at_run_time else "at import"
    printed = [] if at_run_time else [f"{name} prints on stdout {when}", f"{name} prints on stderr {when}"]
    return [
        *printed,
        f"{name} warns {when}",
        f"{name} logs {when}",
        f"{name} logs through its own handler {when}",
    ]


def write_chatty_library(directory: Path, name: str) -> None:
    """A package ``name`` in ``directory`` that chatters at import, and at run time when ``speak()`` is called."""
    (directory / name).mkdir(parents=True)
    (directory / name / "__init__.py").write_text(_CHATTER.format(name=name))


def write_chatty_shadows(directory: Path, names: list[str]) -> None:
    """For each installed library in ``names``, a package of its name in ``directory`` that chatters at import,
    then becomes the installed library."""
    for name in names:
        (directory / name).mkdir(parents=True)
        (directory / name / "__init__.py").write_text(
            _CHATTER.format(name=name) + _BECOME_THE_INSTALLED_ONE.format(name=name)
        )
