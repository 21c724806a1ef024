"""Shared fixtures: real models from the catalog, the real CPU device, real storages (helpers: tests/support/)."""

from __future__ import annotations

import os

import pytest

# Tests never reach a hub: names resolve from local dirs, the cache, or the catalog.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One intra-op thread per trial (every child inherits it): scripts/test.sh runs three workers on two
# cores, and torch's OpenMP threads spin-wait when oversubscribed (GOMP_SPINCOUNT, libgomp's docs), so
# two threads per trial made the whole suite 38 % slower and one DeepSpeed CPU-Adam trial about 10x slower
# (docs/benchmarks.md, "The test suite"). A developer's own OMP_NUM_THREADS wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The developer's own `autotune devices --calibrate` (peaks, bandwidth, a CPU's per-element rates in the user's
# cache) would change what every plan predicts here: the suite reads a file nobody wrote unless a test (or the
# developer, on purpose) names one. Never created by the suite itself.
os.environ.setdefault("AUTOTUNE_PEAKS_FILE", os.path.join(os.devnull, "autotune-tests-peaks.json"))

# A real PostgreSQL server (initdb in a temp dir, loopback only) for the multi-worker tests.
from tests.support import slow_guard
from tests.support.postgres import postgres_server, postgres_url  # noqa: F401 - fixtures

# The files that take longest, heaviest first: what `--durations` showed (scripts/test.sh prints it in
# every CI log). With --dist loadfile pytest-xdist hands each worker whole files in this order
# (scripts/test.sh passes --no-loadscope-reorder; xdist's default orders files by their number of
# tests, which put these few-test files last and left one worker running them alone at the end).
# Longest first keeps the three workers busy until the end (longest-processing-time-first scheduling,
# Graham 1969). The searched study's first reader comes early, so that it is made while the other
# workers run these. A file not listed keeps its collection order after them.
HEAVIEST_FIRST = (
    "tests/test_bad_state_search.py",  # eight searches under faults and signals
    "tests/views/test_export.py",  # the searched study's first reader: it makes the study
    "tests/study/test_postgres_faults.py",  # a restart, a pause and a drop under two workers
    "tests/e2e/test_offline_install.py",
    "tests/runner/test_ranks.py",  # two-rank trials, the killed-rank search among them
    "tests/e2e/test_resume.py",
    "tests/e2e/test_byo_e2e.py",
    "tests/e2e/test_zero_e2e.py",
    "tests/e2e/test_sft_e2e.py",  # three SFTTrainer trials of llama-tiny
    "tests/study/test_postgres_killed_worker.py",
    "tests/test_bench_sft_fidelity.py",
    "tests/runner/test_faults.py",
    "tests/storage/test_storage.py",
    "tests/test_bad_input.py",
    "tests/study/test_postgres.py",
    "tests/e2e/test_search_e2e.py",
    "tests/study/test_loop.py",
    "tests/e2e/test_small_micro_batch_e2e.py",
    "tests/estimate/test_estimate.py",
    "tests/e2e/test_lora_e2e.py",
    "tests/study/test_proposals.py",
    "tests/trainers/test_sft.py",
    "tests/levers/test_weight_dtype.py",
    "tests/plan/test_base_args.py",
    "tests/result/test_loss.py",
    "tests/test_cli_errors.py",
    "tests/storage/test_open.py",
    "tests/views/test_dashboard.py",
    "tests/study/test_confirm.py",
    "tests/test_bad_state.py",
    "tests/estimate/test_what_would_fit.py",
    "tests/study/test_small_ceiling.py",
    "tests/study/test_prune.py",
    "tests/spec/test_measured_peaks.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The heaviest files first (``HEAVIEST_FIRST``); each file's tests keep their order."""
    rank = {path: place for place, path in enumerate(HEAVIEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


# --- the fast loop: a test not marked slow starts no process (tests/support/slow_guard.py) ----------

slow_guard.install()


def pytest_sessionstart(session: pytest.Session) -> None:
    """The installation's CPU process baseline, before any test: one subprocess per installation and
    boot, then read from its cache (autotune/runner/_baseline.py). Every test that plans a CPU trial
    reads it; measured here, the first such test is not the one that starts its process."""
    from autotune.runner import cpu_process_baseline_bytes

    cpu_process_baseline_bytes()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    return (yield from _guarded(item))


def _guarded(item: pytest.Item):
    if item.get_closest_marker("slow") is not None:
        return (yield)
    slow_guard.watch()
    try:
        result = yield
    except BaseException:
        started = slow_guard.processes_started()
        if started:  # whatever the refused start turned into in the code under test: the cause, named
            pytest.fail(slow_guard.failure_message(item.nodeid, started), pytrace=False)
        raise
    started = slow_guard.processes_started()
    if started:  # a refusal the code under test caught and went on
        pytest.fail(slow_guard.failure_message(item.nodeid, started), pytrace=False)
    return result


@pytest.fixture(scope="session")
def cpu():
    from autotune.spec.devices import cpu_device

    return cpu_device()


@pytest.fixture(scope="session")
def bert_tiny():
    from autotune.spec.models import resolve_model

    return resolve_model("bert-tiny")


@pytest.fixture(scope="session")
def gpt2_tiny():
    from autotune.spec.models import resolve_model

    return resolve_model("gpt2-tiny")


@pytest.fixture
def fast_measure():
    """Short measurement windows: tests check behaviour, not speed."""
    from autotune.spec.measure import MeasureSettings

    return MeasureSettings(warmup_steps=1, min_steps=3, max_steps=4, max_seconds=10.0, cv_target=1.0)


@pytest.fixture
def tiny_workload(bert_tiny, cpu, fast_measure):
    """Makes bert-tiny workloads on the CPU (seq len 32, 8 GiB ceiling, short measurement) through
    ``Workload.for_model``; a test passes only what it is about: ``tiny_workload(callbacks=(...,))``."""
    from autotune.runner import Workload

    def make(model=bert_tiny, **changes):
        settings = {"device": cpu, "seq_len": 32, "ceiling_bytes": 8 * 1024**3, "measure": fast_measure}
        return Workload.for_model(model, **{**settings, **changes})

    return make


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite:///{tmp_path / 'study.db'}"


@pytest.fixture(scope="session")
def searched_study(tmp_path_factory, worker_id):
    """One real search with one real OOM, shared by the dashboard, report and export-format tests:
    made once for the whole run, not once per xdist worker (tests/support/made_once.py)."""
    from tests.support.made_once import made_once, run_root
    from tests.support.searched_study import make_searched_study

    return made_once(run_root(tmp_path_factory, worker_id), "searched-study", make_searched_study)


@pytest.fixture(scope="session")
def sft_study(tmp_path_factory, worker_id):
    """One real ``--trainer sft`` search of llama-tiny on the chat corpus, shared by the SFT end-to-end
    tests and the fidelity benchmark's test: made once for the whole run (tests/support/sft_study.py)."""
    from tests.support.made_once import made_once, run_root
    from tests.support.sft_study import make_sft_study

    return made_once(run_root(tmp_path_factory, worker_id), "sft-study", make_sft_study)


@pytest.fixture(scope="session")
def dpo_study(tmp_path_factory, worker_id):
    """One real search of llama-tiny on generated preference pairs (DPOTrainer, chosen by the rows), shared
    by the DPO end-to-end tests: made once for the whole run (tests/support/dpo_study.py)."""
    from tests.support.dpo_study import make_dpo_study
    from tests.support.made_once import made_once, run_root

    return made_once(run_root(tmp_path_factory, worker_id), "dpo-study", make_dpo_study)
