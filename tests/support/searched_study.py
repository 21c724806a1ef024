"""One real study for the tests of what people look at (dashboard, report, export formats).

Built once per test run, whatever the number of xdist workers (the ``searched_study`` fixture in
conftest.py, through ``tests.support.made_once``): a real ``autotune search`` through the command
line's entry point, in the test process that first asks (its trials are real children of that
process's forkserver; tests/e2e/test_search_e2e.py resumes the study with ``python -m autotune``),
then one more trial of the same study, of a config not measured yet, that really runs out of
memory: its child gets a 64 MiB address-space budget (the limit a CPU search sets, only tighter).
"""

from __future__ import annotations

import dataclasses
import itertools
import subprocess
from pathlib import Path

from tests.support.cli import FAST_SEARCH_ARGS, REPO, run_cli_in_process

SPACE = str(REPO / "search_spaces" / "tiny-test.yaml")
STUDY_NAME = "bert-tiny-cpu-s32"  # autotune.study.default_study_name("bert-tiny", cpu, 32)
CEILING = "1GiB"  # above every bert-tiny trial seen here (about 430-500 MiB of peak RSS)
SEARCH_TRIALS = 5
# Measured here (bert-tiny, seq 32, 2 cores; the budget counts from after the memory probe's thread
# started): at 64 and 96 MiB both mb=8 and mb=32 fail in a tensor allocation ("DefaultCPUAllocator:
# can't allocate memory"); at 128 MiB mb=8 trains; at 32 MiB oneDNN cannot even create a primitive.
OOM_ADDRESS_SPACE_BYTES = 64 * 1024**2
OOM_TRIAL_TIMEOUT_S = 300.0


@dataclasses.dataclass(frozen=True)
class SearchedStudy:
    """Where the study lives and how the search that made it went."""

    workdir: Path
    storage: str
    study_name: str
    oom_trial_number: int
    search: subprocess.CompletedProcess


def make_searched_study(workdir: Path) -> SearchedStudy:
    storage = f"sqlite:///{workdir / 'autotune.db'}"
    search = run_cli_in_process(
        "search",
        "--model",
        "bert-tiny",
        "--device",
        "cpu",
        "--space",
        SPACE,
        "--storage",
        storage,
        "--memory-ceiling",
        CEILING,
        "--trials",
        str(SEARCH_TRIALS),
        "--confirm-top",
        "0",
        *FAST_SEARCH_ARGS,
        cwd=workdir,
    )
    assert search.returncode == 0, search.stdout[-3000:] + search.stderr[-3000:]
    oom_trial_number = _record_real_oom(storage, workdir)
    return SearchedStudy(workdir, storage, STUDY_NAME, oom_trial_number, search)


def _record_real_oom(storage: str, workdir: Path) -> int:
    """Run one trial of the study through the real loop with a tiny address-space budget: a real OOM."""
    from autotune.result import TrialResult
    from autotune.runner import Workload
    from autotune.space import load_space
    from autotune.spec.ceiling import parse_ceiling
    from autotune.spec.devices import cpu_device
    from autotune.spec.measure import MeasureSettings
    from autotune.storage import open_storage
    from autotune.study import SearchBudget, SearchRequest, open_study
    from autotune.study._loop import run_search

    device = cpu_device()
    request = SearchRequest(
        workload=Workload.for_model(
            "bert-tiny",
            device=device,
            seq_len=32,
            ceiling_bytes=parse_ceiling(CEILING, device.total_memory_bytes),
            measure=MeasureSettings(warmup_steps=1, max_steps=4),
            address_space_bytes=OOM_ADDRESS_SPACE_BYTES,
        ),
        space=load_space(SPACE, device),
        work_root=str(workdir / "autotune_runs"),
        trial_timeout_s=OOM_TRIAL_TIMEOUT_S,
    )
    study = open_study(open_storage(storage), STUDY_NAME, request)
    measured = [t.params for t in study.trials]
    names = list(request.space.choices)
    unmeasured = next(
        params
        for values in itertools.product(*request.space.choices.values())
        if (params := dict(zip(names, values))) not in measured
    )
    study.enqueue_trial(unmeasured)  # a config measured before would be copied, not run
    run_search(study, request, SearchBudget(trials=1))
    trial = next(t for t in study.trials if t.params == unmeasured and t.state.is_finished())
    result = TrialResult.from_trial(trial)
    assert result is not None and result.status == "oom", result
    return trial.number
