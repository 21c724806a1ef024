"""Helpers shared by the benchmarks (not part of the autotune package).

Trial children import this module by name (``benchmarks._common:FirstStepClock``): a benchmark runs
as ``python -m benchmarks.<name>`` from the repository root, which puts the root on ``sys.path``, and
multiprocessing (and autotune's launcher of several ranks) hands that path to the children.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

REPO = Path(__file__).resolve().parent.parent
FIRST_STEP_FILE = "first_step_monotonic"
PLAIN_RESULT_MARK = "plain-trainer-result: "  # the plain run's result line (torchrun's own lines surround it)


class FirstStepClock(TrainerCallback):
    """Writes ``time.monotonic()`` at the first optimizer step to the trial's output dir.

    CLOCK_MONOTONIC is one clock for every process on the host, so the orchestrator can subtract
    its own reading taken before it started the child.
    """

    def __init__(self) -> None:
        self._written = False

    def on_step_begin(self, args, state, control, **kwargs):
        if not self._written:
            Path(args.output_dir, FIRST_STEP_FILE).write_text(repr(time.monotonic()))
            self._written = True


class StepEnds(TrainerCallback):
    """The ``time.perf_counter()`` at the end of each optimizer step of a plain run."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter())


class AnonPeak:
    """The peak of this process's RSS minus its file-backed pages, sampled every 20 ms on a thread
    (as autotune records it too) from :meth:`start` until :meth:`stop`."""

    def __init__(self) -> None:
        import threading

        self.peak_bytes = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> int:
        self._done.set()
        return self.peak_bytes

    def _sample(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._done.wait(0.02):
            info = me.memory_info()
            self.peak_bytes = max(self.peak_bytes, info.rss - info.shared)


def plain_trainer_command(
    args_file: Path, model: str, seq_len: int, steps: int, ranks: int, weight_dtype: str = "fp32"
) -> list[str]:
    """The fresh process that trains ``args_file`` in a plain Trainer loop (``benchmarks.bench_fidelity --plain``):
    the user's own launch, ``torchrun --nproc-per-node N`` (``--standalone``: a free port), where the
    export spans several ranks or names a DeepSpeed config (DeepSpeed needs the launcher's
    rendezvous variables even on one rank); else one interpreter."""
    import json
    import sys

    script = [
        "-m",
        "benchmarks.bench_fidelity",
        "--plain",
        str(Path(args_file).resolve()),
        "--model",
        model,
        "--seq-len",
        str(seq_len),
        "--plain-steps",
        str(steps),
        "--weight-dtype",
        weight_dtype,
    ]
    if ranks == 1 and "deepspeed" not in json.loads(Path(args_file).read_text()):
        return [sys.executable, *script]
    # torchrun runs it as `python -m` does with its --module flag (torch/distributed/run.py).
    module = ["--module", *script[1:]]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), *module]


def run_plain_trainer(
    args_file: Path, model: str, seq_len: int, steps: int = 30, ranks: int = 1, weight_dtype: str = "fp32"
) -> dict:
    """Train ``args_file`` in a plain Trainer loop in a fresh process (from its directory, where the
    export's relative paths point) and return what it measured (the JSON its result line holds).
    ``weight_dtype``: the winner's, which the export's note says to build the model in."""
    import json
    import os
    import subprocess

    command = plain_trainer_command(args_file, model, seq_len, steps, ranks, weight_dtype)
    # It runs from the export's directory: the repository root, where ``benchmarks`` is, goes on its path.
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=Path(args_file).parent, env={**os.environ, "PYTHONPATH": path}
    )
    if done.returncode != 0:
        raise SystemExit(f"plain Trainer run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    (line,) = [line for line in done.stdout.splitlines() if line.startswith(PLAIN_RESULT_MARK)]
    return json.loads(line.removeprefix(PLAIN_RESULT_MARK))


def read_first_step(work_dir: str) -> float:
    return float(Path(work_dir, FIRST_STEP_FILE).read_text())


def load_average() -> str:
    """The 1, 5 and 15 minute load averages and the core count, as ``uptime`` shows them."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} cores"


def cv(values: list[float]) -> float:
    """Coefficient of variation (sample stdev over mean)."""
    return statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else 0.0


def searched_winner(
    reuse: str | None, prefix: str, search_and_export: Callable[[Path, str], None]
) -> tuple[Path, str, Any]:
    """The fidelity benchmarks' study: ``reuse``'s, else a fresh directory where ``search_and_export(root,
    storage)`` runs the search and writes ``best.json``; returns the directory, the storage URL and the
    ranking's winner (a :class:`autotune.views.ranking.RankedTrial` with a result)."""
    import tempfile

    import optuna

    from autotune.views.ranking import study_ranking

    root = Path(reuse) if reuse else Path(tempfile.mkdtemp(prefix=prefix))
    storage = f"sqlite:///{root / 'study.db'}"
    if not reuse:
        search_and_export(root, storage)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    winner = study_ranking(optuna.load_study(study_name=None, storage=storage))[0]
    assert winner.result is not None
    return root, storage, winner
