"""A CPU search under a small memory ceiling, whose space holds batches that cannot fit, still ends
with a feasible winner: the huge batches are recorded as infeasible (never a crash of the search),
and `autotune export` writes the config that fits.
"""

from __future__ import annotations

import json

import optuna
import pytest
from optuna.trial import TrialState

from autotune.result import TrialResult
from tests.support.cli import run_cli_in_process

pytestmark = pytest.mark.slow

STUDY = "small-ceiling"
CEILING_BYTES = int(1.2 * 1024**3)
# At 512 tokens, 8 samples train bert-tiny in well under 1.2 GiB; 2048 and 8192 samples want
# several GiB for attention scores alone.
HUGE = (8192, 2048)


def test_search_with_batches_beyond_a_small_ceiling_exports_a_feasible_winner(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    space = tmp_path / "space.yaml"
    space.write_text("micro_batch: [8, 2048, 8192]\n")
    # The huge batches first, so the search must live through them before it finds the winner.
    seeded = optuna.create_study(storage=url, study_name=STUDY, direction="maximize")
    for micro_batch in (*HUGE, 8):
        seeded.enqueue_trial({"micro_batch": micro_batch})

    search = run_cli_in_process(
        "search",
        "--model",
        "bert-tiny",
        "--seq-len",
        "512",
        "--memory-ceiling",
        "1.2GiB",
        "--space",
        str(space),
        "--storage",
        url,
        "--study-name",
        STUDY,
        "--trials",
        "3",
        "--work-dir",
        str(tmp_path / "runs"),
        "--warmup-steps",
        "1",
        "--max-measure-steps",
        "4",
        "--confirm-top",
        "0",
        "--callback",
        "tests.support.faults:RecordAddressSpaceLimit",
        cwd=tmp_path,
    )
    assert search.returncode == 0, search.stderr
    assert "Traceback" not in search.stdout + search.stderr

    trials = optuna.load_study(study_name=STUDY, storage=url).get_trials()
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    # (The study's own seed trials, queued behind ours, may still wait.)
    by_batch = {t.params["micro_batch"]: t for t in trials if t.state != TrialState.WAITING}
    assert set(by_batch) == {8, 2048, 8192}
    for micro_batch in HUGE:
        trial = by_batch[micro_batch]
        result = TrialResult.from_trial(trial)
        # Run and out of memory under the child's address-space limit, run and over the ceiling,
        # or predicted not to fit and never run: in every case infeasible, never a failure.
        assert result.status in ("oom", "over_ceiling", "screened"), result
        assert trial.state == TrialState.COMPLETE and trial.value == 0.0
        assert trial.system_attrs["constraints"][0] > 0
    fits = TrialResult.from_trial(by_batch[8])
    assert fits.status == "ok" and fits.peak_memory_bytes <= CEILING_BYTES
    # The trial that ran could grow its address space by the ceiling plus 2 GiB at most.
    (record,) = [json.loads(path.read_text()) for path in (tmp_path / "runs").glob("*/address_space.json")]
    assert record["limit_bytes"] is not None
    assert 0 < record["limit_bytes"] - record["vms_bytes"] <= CEILING_BYTES + 2 * 1024**3

    listing = run_cli_in_process("best", "--all", "--storage", url, "--study-name", STUDY, cwd=tmp_path)
    assert listing.returncode == 0
    for micro_batch in HUGE:
        status = TrialResult.from_trial(by_batch[micro_batch]).status
        assert any(f"mb={micro_batch}" in line and status in line for line in listing.stdout.splitlines())

    exported = run_cli_in_process(
        "export", "--storage", url, "--study-name", STUDY, "--out", str(tmp_path / "best.json"), cwd=tmp_path
    )
    assert exported.returncode == 0, exported.stderr
    arguments = json.loads((tmp_path / "best.json").read_text())
    assert arguments["per_device_train_batch_size"] == 8
