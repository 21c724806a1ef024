"""Many `autotune search` processes on one study in a real PostgreSQL server (tests/postgres.py).

Each process stands for a machine: they share nothing but the database. Optuna's RDB storage is
the coordinator: trials must be neither lost nor run twice, the study-wide cap must hold. The
trial of a worker killed mid-trial: tests/study/test_postgres_killed_worker.py (its own file, so
pytest-xdist's --dist loadfile runs it beside these).
"""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from autotune.storage import open_storage
from tests.support.cli import run_cli_in_process
from tests.support.search_workers import (
    STUDY,
    TINY_SPACE,
    runs_by_trial,
    search_args,
    search_command,
    start,
    study_trials,
)

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def _all_text(trials: list[optuna.trial.FrozenTrial], study: optuna.Study) -> str:
    attrs = [study.user_attrs, study._storage.get_study_system_attrs(study._study_id)]
    for trial in trials:
        attrs += [trial.user_attrs, trial.system_attrs, trial.params]
    return repr(attrs)


def test_concurrent_workers_lose_and_duplicate_no_trial(postgres_server, postgres_url, tmp_path):
    workers, cap = 2, 4  # two processes race as three do (each search process costs ~15 s of CPU to start)
    runs = tmp_path / "runs"
    processes = [
        start(search_command(postgres_url, runs, "--trials", str(cap), "--max-total-trials", str(cap)), tmp_path)
        for _ in range(workers)
    ]
    outputs = [process.communicate(timeout=900) for process in processes]
    for process, (_, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr[-3000:]

    storage = open_storage(postgres_url)
    trials = study_trials(storage)
    counted = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    # Processes check the cap and ask without a common lock: each other one may slip one trial in.
    assert cap <= len(counted) <= cap + workers - 1
    assert sorted(t.number for t in trials) == list(range(len(trials)))
    # Both started together, yet one of them set the study up: its seed configs were queued once.
    seed_labels = [
        t.user_attrs["seed"] for t in trials if "seed" in t.user_attrs and "failed_trial" not in t.system_attrs
    ]
    assert seed_labels and len(seed_labels) == len(set(seed_labels)), seed_labels
    ran = runs_by_trial(runs)
    assert all(len(pids) == 1 for pids in ran.values()), ran  # no trial was run twice
    assert all(t.number in ran or "reused_from" in t.user_attrs for t in counted)  # none was lost
    assert len({pids[0] for pids in ran.values()}) >= 2  # the processes really shared the work
    owners = {t.number: t.system_attrs["autotune_owner"]["pid"] for t in trials}
    assert all(owners[number] == pids[0] for number, pids in ran.items())

    # The URL carried a password: no output and no stored attribute may show it.
    study = optuna.load_study(study_name=STUDY, storage=storage)
    assert postgres_server.password in postgres_url
    for stdout, stderr in outputs:
        assert postgres_server.password not in stdout + stderr
        assert "autotune:***@" in stdout  # the storage is still named, redacted
    assert postgres_server.password not in _all_text(trials, study)


def test_workers_opening_a_new_study_at_once_set_it_up_once(postgres_url, cpu, tiny_workload):
    import threading

    from autotune.space import load_space
    from autotune.study import SearchRequest, open_study

    request = SearchRequest(
        workload=tiny_workload(ceiling_bytes=2 * 1024**3),
        space=load_space(TINY_SPACE, cpu),
    )
    # Four "machines" at once on an empty database: each opens its own storage (Optuna creates its
    # tables then) and creates the study.
    workers = 4
    barrier = threading.Barrier(workers)
    errors: list[BaseException] = []

    def join() -> None:
        barrier.wait()
        try:
            open_study(open_storage(postgres_url), STUDY, request)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=join) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    storage = open_storage(postgres_url)
    seeds = [t.user_attrs["seed"] for t in study_trials(storage)]
    assert seeds and len(seeds) == len(set(seeds)), seeds  # queued once, not once per worker
    study = optuna.load_study(study_name=STUDY, storage=storage)
    assert study.user_attrs["identity"] == request.identity()


def test_a_password_in_the_url_is_never_printed_even_when_the_connection_fails(postgres_server, tmp_path):
    wrong_password = "wrong-" + postgres_server.password[::-1]
    url = postgres_server.url("postgres", password=wrong_password)
    # Refused before any trial: the entry point in this process (what a user sees is the same).
    completed = run_cli_in_process(
        "search", "--model", "bert-tiny", "--device", "cpu", "--storage", url, "--trials", "1", cwd=tmp_path
    )
    assert completed.returncode == 2
    assert "cannot open it" in completed.stderr
    assert "autotune:***@" in completed.stderr
    assert wrong_password not in completed.stdout + completed.stderr


def test_a_password_given_as_a_query_parameter_is_used_and_never_printed(postgres_server, postgres_url, tmp_path):
    """libpq reads ``?password=`` (SQLAlchemy hands the query to the driver): the search connects with
    it, and neither the search nor ``best`` nor a failed connection shows it."""
    url = postgres_url.replace(f":{postgres_server.password}@", "@") + f"?password={postgres_server.password}"
    # The test is about what is printed and stored, not about processes: the entry point in this process
    # (a worker's arguments); the concurrent workers above are real processes.
    search = run_cli_in_process(*search_args(url, tmp_path / "runs", "--trials", "1"), cwd=tmp_path)
    assert search.returncode == 0, search.stderr[-3000:]  # the query's password opened the database
    best = run_cli_in_process("best", "--storage", url, cwd=tmp_path)
    assert best.returncode == 0, best.stderr[-3000:]
    wrong = url.replace(postgres_server.password, "wrong-" + postgres_server.password[::-1])
    refused = run_cli_in_process("best", "--storage", wrong, cwd=tmp_path)
    assert refused.returncode == 2 and "cannot open it" in refused.stderr
    assert "?password=***" in search.stdout and "?password=***" in refused.stderr  # named, redacted
    shown = search.stdout + search.stderr + best.stdout + best.stderr + refused.stdout + refused.stderr
    assert postgres_server.password not in shown and postgres_server.password[::-1] not in shown
