"""What ``autotune verify`` prints of a verification: each figure says what it is and how it moved, the
versions that changed, one verdict (tests/study/test_verify.py runs the real thing)."""

from __future__ import annotations

from autotune.result import FigureCheck, Judgement, StudyAnswer, Verification, VersionChange
from autotune.views.verify import figure_text, verdict_line, versions_line

MiB = 1024**2


def _verification(*checks: FigureCheck, changed: tuple[VersionChange, ...] = ()) -> Verification:
    return Verification(
        answer=StudyAnswer(3, 200.0, 500 * MiB, 0, 100.0),
        checks=checks,
        changed=changed,
        noise=0.05,
        study_noise=0.04,
        today_noise=0.05,
        interval=0.1,
        tolerance=None,
        runs={3: ("ok",), 0: ("ok",)},
        failures=(),
        seconds=12.0,
        device="cpu (a CPU)",
    )


def test_each_figure_says_today_the_record_and_how_it_moved():
    assert figure_text(FigureCheck("winner", 200.0, 300.0, Judgement.BETTER), None) == (
        "300.0 today, 200.0 recorded: +50.0%, faster than recorded"
    )
    assert figure_text(FigureCheck("speedup", 2.0, 1.9, Judgement.WITHIN), 0.1) == (
        "1.90x today, 2.00x recorded: -5.0%, within the tolerance"
    )
    assert figure_text(FigureCheck("peak memory", 500 * MiB, 700 * MiB, Judgement.WORSE, False), None) == (
        "700.00 MiB today, 500.00 MiB recorded: +40.0%, larger than recorded"
    )
    assert figure_text(FigureCheck("default", 100.0, None, Judgement.NOT_MEASURED), None) == (
        "not measured today (no re-run ran and fit), 100.0 recorded"
    )


def test_the_verdict_names_what_regressed_or_says_it_holds():
    slower = FigureCheck("winner", 200.0, 100.0, Judgement.WORSE)
    lost = FigureCheck("default", 100.0, None, Judgement.NOT_MEASURED)
    within = FigureCheck("speedup", 2.0, 2.0, Judgement.WITHIN)
    regressed = _verification(slower, lost, within)
    assert not regressed.holds
    assert verdict_line(regressed) == "verdict: REGRESSED: winner slower than recorded, default not measured"
    faster = _verification(FigureCheck("winner", 200.0, 400.0, Judgement.BETTER), within)
    assert faster.holds
    assert verdict_line(faster) == "verdict: the study's answer holds on today's install (winner better than recorded)"


def test_the_versions_that_changed_and_those_the_study_did_not_record():
    changed = (VersionChange("transformers", "4.57.1", "5.24.0"), VersionChange("peft", None, "0.21.2"))
    assert versions_line(_verification(changed=changed)) == (
        "versions: changed since the study: transformers 4.57.1 -> 5.24.0; not recorded by the study (measured "
        "before autotune recorded them): peft (today 0.21.2)"
    )
    assert versions_line(_verification()) == "versions: none changed since the study's winner was measured"
