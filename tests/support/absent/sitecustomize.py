"""Makes the modules named in ``AUTOTUNE_TEST_ABSENT`` (comma-separated) absent from an interpreter that has
this directory on its ``PYTHONPATH``, and so from every process it starts with its environment (the
forkserver, the trial children): ``import`` raises ImportError and ``importlib.util.find_spec`` returns
None, as for a package that is not installed (importlib/util.py, ``find_spec``: a ``None`` in
``sys.modules``)."""

import os
import sys

for _name in filter(None, os.environ.get("AUTOTUNE_TEST_ABSENT", "").split(",")):
    sys.modules[_name] = None  # type: ignore[assignment]  # None in sys.modules makes the import fail, as absent
