"""``autotune verify``: a study's answer measured again, judged against its record, one verdict.

The scenario is real: a search of bert-tiny recorded with a callback that makes every step four times
as long as its own time (``tests.support.faults.SlowSteps``, a slower install), then verified without
it (faster than recorded: exit 0) and with one that makes them four times longer still (``SlowerSteps``:
a regression, exit 1), each re-run a real trial child. The judgement's rule and the versions' comparison
are tested on their own; the bad inputs are one line each, exit 2.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import re
from pathlib import Path

import optuna
import pytest

from autotune.result import Judgement, TrialResult, VersionChange
from autotune.runner._measured import NOT_INSTALLED, RECORDED_DISTRIBUTIONS
from autotune.storage import schema
from autotune.study._verify import changed_versions, judge
from tests.support.bad_input import assert_one_error_line
from tests.support.cli import FAST_SEARCH_ARGS, run_cli_in_process

GiB = 1024**3

STUDY = "slow-install"


# --- the judgement: the confirmation's rule, or --tolerance -------------------------------------------


@pytest.mark.parametrize(
    ("today", "noise", "tolerance", "expected"),
    [
        (100.0, 0.05, None, Judgement.WITHIN),
        # Intervals of +-10 % (2 x 5 %): 81 reaches up to 89.1, the record down to 90: apart; 82 reaches 90.2.
        (81.0, 0.05, None, Judgement.WORSE),
        (82.0, 0.05, None, Judgement.WITHIN),
        (123.0, 0.05, None, Judgement.BETTER),
        # A noisier period widens both intervals: 2 x 20 %.
        (50.0, 0.20, None, Judgement.WITHIN),
        (40.0, 0.20, None, Judgement.WORSE),
        # The noise counts as at least the floor (5 %), however quiet the study was.
        (83.0, 0.001, None, Judgement.WITHIN),
        # --tolerance replaces the noise: 10 % of the record either way.
        (91.0, 0.20, 0.1, Judgement.WITHIN),
        (89.0, 0.20, 0.1, Judgement.WORSE),
        (111.0, 0.0, 0.1, Judgement.BETTER),
        (None, 0.05, None, Judgement.NOT_MEASURED),
    ],
)
def test_a_figure_is_judged_against_its_record_by_the_noise_or_the_tolerance(today, noise, tolerance, expected):
    assert judge(100.0, today, noise, tolerance) == expected


def test_less_is_better_for_peak_memory():
    assert judge(100.0, 130.0, 0.05, None, higher_is_better=False) == Judgement.WORSE
    assert judge(100.0, 70.0, 0.05, None, higher_is_better=False) == Judgement.BETTER
    assert judge(100.0, 105.0, 0.05, 0.1, higher_is_better=False) == Judgement.WITHIN


def test_the_versions_that_changed_and_those_never_recorded():
    recorded = {"torch": "2.12.0", "transformers": "4.57.1", "python": "3.11.9", "device": "cpu"}
    today = {"torch": "2.13.0", "transformers": "4.57.1", "accelerate": "1.15.0", "python": "3.11.9", "device": "x"}
    assert changed_versions(recorded, today) == (
        VersionChange("torch", "2.12.0", "2.13.0"),
        VersionChange("accelerate", None, "1.15.0"),
    )
    assert changed_versions(recorded, {}) == ()  # no re-run recorded any: nothing to compare


# --- bad input: one line, exit 2, nothing measured ------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["--repeats", "0"], "--repeats 0"),
        (["--tolerance", "1.5"], "--tolerance 1.5"),
        (["--tolerance", "-0.1"], "--tolerance -0.1"),
    ],
)
def test_bad_options_are_refused_before_the_study_is_read(args, phrase, tmp_path):
    completed = run_cli_in_process("verify", "--storage", f"sqlite:///{tmp_path / 'none.db'}", *args, cwd=tmp_path)
    assert_one_error_line(completed, phrase)
    assert not (tmp_path / "none.db").exists()


def test_a_study_with_no_winner_has_nothing_to_verify(tmp_path):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    optuna.create_study(storage=url, study_name="empty", direction="maximize")
    assert_one_error_line(run_cli_in_process("verify", "--storage", url, cwd=tmp_path), "no winner to verify")


def test_a_storage_without_a_study_is_one_line(tmp_path):
    url = f"sqlite:///{tmp_path / 'absent.db'}"
    optuna.create_study(storage=url, study_name="other", direction="maximize")
    completed = run_cli_in_process("verify", "--storage", url, "--study-name", "absent", cwd=tmp_path)
    assert_one_error_line(completed, "absent")


def test_profile_of_a_study_whose_trials_run_on_several_ranks_is_refused_before_any_run(monkeypatch):
    """Each rank of a multi-rank trial would profile its own: ``--profile`` is one line, before any re-run."""
    import types

    from autotune.errors import AutotuneError
    from autotune.plan import VerifyOptions
    from autotune.result import StudyAnswer
    from autotune.study import _verify

    two_ranks = types.SimpleNamespace(workload=types.SimpleNamespace(devices_per_trial=2))
    monkeypatch.setattr(_verify, "verify_request", lambda study, options: two_ranks)
    ran: list[object] = []
    study = types.SimpleNamespace(study_name="ranks")
    answer = StudyAnswer(winner_trial=0, winner_samples_per_s=1.0, winner_peak_bytes=1)
    with pytest.raises(AutotuneError, match="trains each trial on 2 ranks"):
        _verify.verify(study, answer, VerifyOptions("sqlite://", profile=True), run_trial=lambda *a: ran.append(a))
    assert ran == []


# --- the scenario: a study recorded on a slow install -------------------------------------------------


@pytest.fixture(scope="module")
def slow_study(tmp_path_factory) -> tuple[Path, str]:
    """A real search of two configs (the HF default's micro-batch 8, and 32), every trial slowed down
    by :class:`tests.support.faults.SlowSteps`."""
    workdir = tmp_path_factory.mktemp("verify")
    space = workdir / "space.yaml"
    space.write_text("micro_batch: [8, 32]\n")
    url = f"sqlite:///{workdir / 'study.db'}"
    search = run_cli_in_process(
        "search",
        "--model",
        "bert-tiny",
        *FAST_SEARCH_ARGS,
        "--space",
        str(space),
        "--storage",
        url,
        "--study-name",
        STUDY,
        "--memory-ceiling",
        "2GiB",
        "--trials",
        "2",
        "--prune-ratio",
        "0",  # both configs measured to the end, so the winner and the default are two trials
        "--callback",
        "tests.support.faults:SlowSteps",
        cwd=workdir,
    )
    assert search.returncode == 0, search.stdout[-3000:] + search.stderr[-3000:]
    return workdir, url


def _verify(slow_study: tuple[Path, str], *args: str):
    workdir, url = slow_study
    before = optuna.load_study(study_name=STUDY, storage=url)
    trials, attrs = len(before.trials), before.user_attrs
    completed = run_cli_in_process("verify", "--storage", url, *args, cwd=workdir)
    after = optuna.load_study(study_name=STUDY, storage=url)
    assert (len(after.trials), after.user_attrs) == (trials, attrs)  # verify writes nothing into the study
    assert "Traceback" not in completed.stdout + completed.stderr, completed.stderr[-3000:]
    return completed


@pytest.mark.slow
def test_each_trial_records_the_versions_it_ran_with(slow_study):
    study = optuna.load_study(study_name=STUDY, storage=slow_study[1])
    assert schema.STUDY_SEARCH_OPTIONS in study.user_attrs  # what verify plans the workload from
    for trial in study.trials:
        versions = TrialResult.from_trial(trial).versions
        for name in RECORDED_DISTRIBUTIONS:
            try:
                installed = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                installed = NOT_INSTALLED
            assert versions[name] == installed, (name, versions)


@pytest.mark.slow
def test_without_the_slow_callback_the_answer_holds_faster_than_recorded(slow_study):
    # Four times the recorded speed, judged by --tolerance: the study's noise on a loaded 2-core machine
    # (CI's three test workers) widens the intervals until 4x is within reach (seen: 49 % step-time noise,
    # intervals of +-98 %); the rule by noise is tested on its own above. 75 %, not 50 %: the speedup is
    # judged too, and each config was measured once in the search, under whatever load the other workers
    # put on the cores then (CI, stop 57: the default recorded at 7.5 samples/s where the slowed step
    # alone says about 20, so a recorded speedup of 4.59x against 2.13x re-measured, -53.5 %). A speedup
    # below a quarter of the record is still a regression here, and a 4x faster winner still "faster".
    completed = _verify(slow_study, "--repeats", "2", "--tolerance", "0.75")
    out = completed.stdout
    assert completed.returncode == 0, out[-3000:] + completed.stderr[-3000:]
    assert re.search(r"^winner #\d+ samples/s: .* faster than recorded$", out, re.MULTILINE), out
    assert "verdict: the study's answer holds on today's install" in out.splitlines()[-1]
    # Interleaved: A B, then B A.
    rounds = re.findall(r"round (\d)/2: (winner|HF default) #", out)
    assert rounds == [("1", "winner"), ("1", "HF default"), ("2", "HF default"), ("2", "winner")], out
    assert "versions: none changed" in out
    assert "ran with --callback tests.support.faults:SlowSteps; these re-runs with none" in out


@pytest.mark.slow
def test_with_profile_each_answers_run_says_where_its_step_time_went_and_is_not_judged(slow_study):
    """``--profile``: after the judged round, one profiled run of the winner and of the default each; their
    operators, per step, and the files of the whole profile. The re-runs judged are the round's alone."""
    completed = _verify(slow_study, "--repeats", "1", "--tolerance", "0.5", "--profile")
    out = completed.stdout
    assert completed.returncode == 0, out[-3000:] + completed.stderr[-3000:]
    assert "measured on " in out and ": 2 re-run(s) in " in out  # the profiled runs are not re-runs
    assert re.findall(r"^  profiled: (winner|HF default) #\d+ ok$", out, re.MULTILINE) == ["winner", "HF default"], out
    for name in ("winner", "HF default"):
        (header,) = re.findall(rf"^where the step time went, {name} #\d+: .*$", out, re.MULTILINE)
        assert "ms per step over 3 profiled step(s)" in header and "data loading" in header, header
        assert "some kernel ran" not in header  # the device's busy share is CUDA's
    # The slow callback of the search is not in these runs; bert-tiny's step is its matmuls and its update.
    assert re.search(r"^  aten::(addmm|mm): [\d.]+ ms per step \(\d+% of the step, CPU self time", out, re.MULTILINE), (
        out
    )
    tables = re.findall(
        r"^  every operator: (\S+); the trace \(open it in https://ui.perfetto.dev\): (\S+)$", out, re.MULTILINE
    )
    assert len(tables) == 2 and all(Path(table).is_file() and Path(trace).is_file() for table, trace in tables), tables


@pytest.mark.slow
def test_with_a_heavier_callback_the_answer_regressed(slow_study):
    # A quarter of the recorded speed, judged by --tolerance: however noisy the machine is today.
    args = ("--repeats", "1", "--tolerance", "0.5", "--callback", "tests.support.faults:SlowerSteps")
    completed = _verify(slow_study, *args)
    out = completed.stdout
    assert completed.returncode == 1, out[-3000:] + completed.stderr[-3000:]
    verdict = out.splitlines()[-1]
    assert verdict.startswith("verdict: REGRESSED: ") and "winner slower than recorded" in verdict, out
    assert "judged against: --tolerance 50% of each recorded figure" in out


@pytest.mark.slow
def test_a_device_not_present_and_a_study_of_another_device_are_one_line(slow_study, tmp_path):
    workdir, url = slow_study
    completed = run_cli_in_process("verify", "--storage", url, "--device", "cuda:7", cwd=workdir)
    assert_one_error_line(completed, "CUDA device")
    copy = f"sqlite:///{tmp_path / 'copy.db'}"
    optuna.copy_study(from_study_name=STUDY, from_storage=url, to_storage=copy)
    study = optuna.load_study(study_name=STUDY, storage=copy)
    study.set_user_attr(schema.STUDY_IDENTITY, {**study.user_attrs[schema.STUDY_IDENTITY], "device": "AMD EPYC 9654"})
    assert_one_error_line(run_cli_in_process("verify", "--storage", copy, cwd=workdir), "measured on AMD EPYC 9654")
    study.set_user_attr(schema.STUDY_SEARCH_OPTIONS, None)  # as a study made before they were recorded
    assert_one_error_line(run_cli_in_process("verify", "--storage", copy, cwd=workdir), "does not record the options")


def test_a_cpu_trials_ranks_share_the_ceiling_as_planned_resumed_and_verified(tmp_path):
    """`--device cpu --devices-per-trial 2 --memory-ceiling 4GiB`: each rank is judged against 2 GiB (the ranks
    share the machine's RAM, as the exported run's would), a GPU trial's ranks against the whole; the study keeps
    the rank's ceiling, a resume under another ceiling names both as the user typed them, and verify plans the
    study's rank ceiling again, not half of it."""
    from autotune.errors import AutotuneError
    from autotune.plan import SearchOptions, VerifyOptions, plan
    from autotune.plan._options import EstimateOptions
    from autotune.study import open_study, prepare_request
    from autotune.study._verify import verify_request
    from tests.support.cli import REPO

    space = str(REPO / "search_spaces" / "tiny-test.yaml")
    common = {"model": "bert-tiny", "seq_len": 32, "space": space, "devices_per_trial": 2}
    gpus = plan(EstimateOptions(**common, gpu_type="h100-sxm", memory_ceiling="40GiB"))
    assert gpus.workload.ceiling_bytes == 40 * GiB
    url = f"sqlite:///{tmp_path / 'study.db'}"
    options = SearchOptions(**common, device="cpu", memory_ceiling="4GiB", work_dir=str(tmp_path / "runs"))
    prepared = prepare_request(options, 64 * GiB)
    assert prepared.request.ceiling_bytes == 2 * GiB
    assert any("a rank's share of the memory ceiling: 2.00 GiB (2 ranks share" in note for note in prepared.notes)
    storage = optuna.storages.RDBStorage(url)
    study = open_study(storage, "ranks", prepared.request)
    assert study.user_attrs[schema.STUDY_CEILING_BYTES] == 2 * GiB
    again = prepare_request(dataclasses.replace(options, memory_ceiling="3GiB"), 64 * GiB).request
    with pytest.raises(AutotuneError, match=r"memory ceiling of 4\.00 GiB, this run asks 3\.00 GiB"):
        open_study(storage, "ranks", again)
    assert verify_request(study, VerifyOptions(url, study_name="ranks")).ceiling_bytes == 2 * GiB
