"""One vocabulary of trial statuses (autotune.result.Status): its groups are defined once, every map
keyed by status covers exactly the vocabulary, and stored studies read back unchanged."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from autotune.result import (
    FAILED_STATUSES,
    INFEASIBLE_STATUSES,
    MEMORY_EXCEEDED_STATUSES,
    PEAK_MEASURED_STATUSES,
    RAN_NORMALLY_STATUSES,
    RETRIED_STATUSES,
    UNFINISHED_LABELS,
    Status,
    TrialResult,
    in_order,
)
from autotune.result._trial_result import FEASIBLE_STATUSES

PACKAGE = Path(__file__).resolve().parent.parent.parent / "autotune"
# The strings studies have always stored (autotune/result/_trial_result.py before the Status type).
STORED = [
    "ok",
    "over_ceiling",
    "oom",
    "screened",
    "pruned",
    "diverged",
    "recompiling",
    "timeout",
    "compile_timeout",
    "crash",
    "error",
    "interrupted",
]


def test_stored_statuses_read_back_as_the_vocabulary_and_are_stored_as_the_same_strings():
    assert [status.value for status in Status] == STORED
    for text in STORED:
        result = TrialResult.from_dict({"status": text})
        assert result.status is Status(text) and result.status == text
        assert json.loads(json.dumps(result.to_dict()))["status"] == text
    with pytest.raises(ValueError):
        TrialResult(status="fine")


def test_every_status_is_exactly_one_of_feasible_infeasible_pruned_or_failed():
    """How each is recorded (autotune.study._record.tell): COMPLETE with its value, COMPLETE with value 0
    and a violated constraint, PRUNED, or FAIL."""
    kinds = [FEASIBLE_STATUSES, INFEASIBLE_STATUSES, {Status.PRUNED}, FAILED_STATUSES]
    for status in Status:
        assert sum(status in kind for kind in kinds) == 1, status


def test_the_groups_say_what_was_measured():
    # A trial that ran normally measured its speed and its peak; a diverged one only its peak.
    assert RAN_NORMALLY_STATUSES < PEAK_MEASURED_STATUSES
    assert PEAK_MEASURED_STATUSES - RAN_NORMALLY_STATUSES == {Status.DIVERGED}
    assert FEASIBLE_STATUSES < RAN_NORMALLY_STATUSES
    assert not PEAK_MEASURED_STATUSES & (FAILED_STATUSES | {Status.OOM, Status.SCREENED})
    assert MEMORY_EXCEEDED_STATUSES < INFEASIBLE_STATUSES and RETRIED_STATUSES < FAILED_STATUSES
    assert in_order(INFEASIBLE_STATUSES) == [
        Status.OVER_CEILING,
        Status.OOM,
        Status.SCREENED,
        Status.DIVERGED,
        Status.RECOMPILING,
    ]


def test_maps_keyed_by_status_cover_exactly_the_vocabulary():
    from autotune.views.report import STATUS_COLORS, STATUS_MEANING
    from autotune.views.trial_table import STATUS_STYLE

    assert set(STATUS_STYLE) == set(Status)
    # The report also colours the trials that have no result yet.
    assert set(STATUS_COLORS) == set(STATUS_MEANING) == set(Status) | set(UNFINISHED_LABELS.values())


def status_collections(path: Path) -> list[int]:
    """Lines of tuple, list and set literals of two or more status names in one source file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            names = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if len(names) >= 2 and len(names) == len(node.elts) and set(names) <= set(STORED):
                found.append(node.lineno)
    return found


def test_no_group_of_statuses_is_spelt_outside_the_vocabulary():
    offences = {
        str(path.relative_to(PACKAGE)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "result.py" and (lines := status_collections(path))
    }
    assert offences == {}


def test_the_checker_sees_a_group_spelt_elsewhere(tmp_path):
    source = tmp_path / "module.py"
    source.write_text('GROUP = ("ok", "pruned")\nOTHER = ["a", "ok"]\n')
    assert status_collections(source) == [1]
