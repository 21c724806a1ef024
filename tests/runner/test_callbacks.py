"""``--callback`` classes (autotune.runner._callbacks): a right name gives the class, a wrong one one
line naming what is wrong, before any trial."""

from __future__ import annotations

import re

import pytest

from autotune.errors import AutotuneError
from autotune.runner import load_callback


def test_a_module_and_class_name_loads_the_trainer_callback_class():
    from transformers import TrainerCallback

    from tests.support.faults import RecordCollectorState

    loaded = load_callback("tests.support.faults:RecordCollectorState")

    assert loaded is RecordCollectorState and issubclass(loaded, TrainerCallback)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "tests.support.faults",
            "--callback 'tests.support.faults': give it as module:Class (for example mypkg.probes:MyCallback)",
        ),
        (":RecordCollectorState", "give it as module:Class"),
        (
            "no_such_module_here:Probe",
            "--callback 'no_such_module_here:Probe': cannot import no_such_module_here (No module named 'no_such_module_here'); is it on PYTHONPATH?",
        ),
        (
            "tests.support.faults:NoSuchCallback",
            "--callback 'tests.support.faults:NoSuchCallback': tests.support.faults has no TrainerCallback class named NoSuchCallback",
        ),
        (
            "tests.support.faults:fill_file_system",
            "has no TrainerCallback class named fill_file_system",
        ),  # a function, not a callback
    ],
)
def test_a_wrong_name_is_one_line_naming_what_is_wrong(name, message):
    with pytest.raises(AutotuneError, match=re.escape(message)):
        load_callback(name)
