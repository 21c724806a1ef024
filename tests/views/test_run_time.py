"""The whole run's projected wall time and cost (issue 40, point 4) where people read it: the search's summary,
``best``, ``export``'s header, the report and ``estimate`` (predicted), on the real SFT study the suite makes
once (tests/support/sft_study.py: 160 generated chat rows, llama-tiny) and the bert-tiny study of
synthetic tokens (tests/support/searched_study.py). The arithmetic is tested in tests/result/test_run_time.py."""

from __future__ import annotations

import optuna
import pytest

from autotune.result import TrialResult, duration
from autotune.result._run_time import money
from autotune.storage import schema
from tests.support.bad_input import assert_one_error_line
from tests.support.cli import run_cli_in_process

pytest.importorskip("trl")

CHAT_ROWS = 160  # tests/support/sft_study.py's corpus


def _study(storage: str) -> optuna.Study:
    return optuna.load_study(study_name=None, storage=storage)


def _expected_winner_seconds(study: optuna.Study, epochs: float) -> float:
    """The winner's run, computed here from the study's record: every row ``epochs`` times at its recorded
    samples/s, and its warm-up beyond as many steady steps (an SFT step trains the samples its rows held)."""
    from autotune.views.verify import study_answer

    answer = study_answer(study)
    result = TrialResult.from_trial(study.trials[answer.winner_trial])
    assert result is not None
    samples_per_step = result.samples_per_s * result.measured_s / result.measured_steps
    warmup_excess = max(result.warmup_s - result.warmup_steps * samples_per_step / answer.winner_samples_per_s, 0.0)
    return CHAT_ROWS * epochs / answer.winner_samples_per_s + warmup_excess


@pytest.mark.slow
def test_the_sft_search_records_its_rows_and_its_summary_projects_the_default_three_epochs(sft_study):
    study = _study(sft_study.storage)
    assert study.user_attrs[schema.STUDY_DATASET_SAMPLES] == CHAT_ROWS
    summary = sft_study.search.stdout
    line = next(line for line in summary.splitlines() if line.startswith("projected wall time"))
    assert line.startswith(f"projected wall time of 3 epochs over {CHAT_ROWS} samples (the default num_train_epochs")
    assert f"{duration(_expected_winner_seconds(study, 3.0))} (winner #" in line
    assert "TRL default #0" in line and ("saved" in line or "longer" in line)


@pytest.mark.slow
def test_best_projects_the_epochs_asked_and_costs_them_at_the_price_per_device_hour(sft_study):
    shown = run_cli_in_process(
        "best", "--storage", sft_study.storage, "--epochs", "2", "--price-per-hour", "4", cwd=sft_study.root
    )
    assert shown.returncode == 0, shown.stderr
    (line,) = [line for line in shown.stdout.splitlines() if line.startswith("projected wall time")]
    seconds = _expected_winner_seconds(_study(sft_study.storage), 2.0)
    assert f"of 2 epochs over {CHAT_ROWS} samples (--epochs): {duration(seconds)} (winner #" in line
    assert f"; cost {money(seconds / 3600 * 4)} vs $" in line and "at $4/h per device x 1 device;" in line


@pytest.mark.slow
def test_the_export_carries_the_run_time_in_its_header_and_says_it_beside_json(sft_study, tmp_path):
    out = tmp_path / "best.py"
    written = run_cli_in_process(
        "export", "--storage", sft_study.storage, "--format", "python", "--out", str(out), "--epochs", "1", cwd=tmp_path
    )
    assert written.returncode == 0, written.stderr
    header = [line for line in out.read_text().splitlines() if line.startswith("#")]
    assert any(line.startswith(f"# projected wall time of 1 epoch over {CHAT_ROWS} samples") for line in header)
    as_json = run_cli_in_process("export", "--storage", sft_study.storage, "--out", "-", cwd=tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    assert "note: projected wall time of 3 epochs" in as_json.stderr  # JSON takes no comment: a note on stderr


@pytest.mark.slow
def test_the_report_shows_the_run_time(sft_study, tmp_path):
    out = tmp_path / "report.html"
    made = run_cli_in_process(
        "report", "--storage", sft_study.storage, "--out", str(out), "--price-per-hour", "2.5", cwd=tmp_path
    )
    assert made.returncode == 0, made.stderr
    page = out.read_text()
    assert f"projected wall time of 3 epochs over {CHAT_ROWS} samples" in page and "at $2.5/h per device" in page


@pytest.mark.slow
def test_a_study_of_synthetic_tokens_says_what_the_run_time_needs_rather_than_invent_it(searched_study):
    shown = run_cli_in_process("best", "--storage", searched_study.storage, cwd=searched_study.workdir)
    assert shown.returncode == 0, shown.stderr
    assert (
        "projected wall time of 3 epochs (the default num_train_epochs; --epochs sets it): needs the dataset's size"
        in (" ".join(shown.stdout.split()))
    )


@pytest.mark.slow
def test_estimate_predicts_the_run_time_for_a_gpu_you_lack_marked_predicted(tmp_path):
    from benchmarks.bench_sft_fidelity import SPACE

    made = run_cli_in_process(
        "chat-corpus", "--out", "chat.jsonl", "--samples", "40", "--length-scale", "0.03", cwd=tmp_path
    )
    assert made.returncode == 0, made.stderr
    (tmp_path / "space.yaml").write_text(SPACE)  # micro-batches of 4 and 8: one global batch of the 40 rows
    shown = run_cli_in_process(
        *("estimate", "--model", "llama-tiny", "--gpu-type", "h200", "--seq-len", "48", "--space", "space.yaml"),
        *("--dataset", "chat.jsonl", "--epochs", "2", "--price-per-hour", "3"),
        cwd=tmp_path,
    )
    assert shown.returncode == 0, shown.stderr
    line = " ".join(shown.stdout.split())
    assert "predicted wall time of 2 epochs over 40 samples (--epochs): " in line
    assert "(predicted winner, predicted " in line and "at $3/h per device x 1 device" in line


def test_epochs_that_contradict_the_base_args_max_steps_are_refused_before_any_trial(tmp_path):
    (tmp_path / "base.json").write_text('{"max_steps": 100}')
    refused = run_cli_in_process(
        *("search", "--model", "bert-tiny", "--device", "cpu", "--epochs", "2"),
        *("--base-args", "base.json", "--storage", f"sqlite:///{tmp_path / 'x.db'}"),
        cwd=tmp_path,
    )
    assert_one_error_line(refused, "autotune: error: --epochs 2: --base-args sets max_steps 100")
    assert not (tmp_path / "x.db").exists()  # nothing written


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_studys_run_of_max_steps_trains_every_ranks_share_of_the_global_batch(ranks):
    """A trial of N ranks records its ranks' samples/s summed and its global batch knob as each rank's share:
    a run of max_steps trains N shares a step (it once counted one, so N ranks' run was projected N times short)."""
    from autotune.result import Status
    from autotune.views.run_time import study_run_time
    from tests.support.recorded_study import add_recorded_trial

    study = optuna.create_study(direction="maximize")
    study.set_user_attr(schema.STUDY_DEVICE_KIND, "cpu")
    study.set_user_attr(schema.STUDY_BASE_ARGS, {"max_steps": 100})
    study.set_user_attr(schema.STUDY_SEARCH_OPTIONS, {"devices_per_trial": ranks} if ranks > 1 else {})
    result = TrialResult(status=Status.OK, samples_per_s=10.0, model_tflops=1.0, peak_memory_bytes=2**30)
    add_recorded_trial(study, {"micro_batch": 4}, result)
    line = study_run_time(study)
    assert line is not None
    assert f": {duration(100 * 4 * ranks / 10.0)} (winner #0" in line, line
