"""What the user watches and reads: the live search view and what a search prints (Rich); the trial table itself is
:mod:`autotune.views.trial_table`'s."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Column
from rich.text import Text

from autotune.levers import TrialConfig
from autotune.result import (
    FAILED_STATUSES,
    Status,
    TimeSpent,
    TrialResult,
    comparable_hf_default,
    diverged_trials,
    judged_trials,
    winner_loss,
)
from autotune.spec.ceiling import ranks_sharing
from autotune.storage import schema
from autotune.units import format_bytes
from autotune.views.confirmation_words import default_beside, describe_confirmation, describe_winner
from autotune.views.ranking import (
    RankedTrial,
    all_trials,
    confirmations_of,
    describe_distinct,
    describe_ranking_basis,
    describe_standing,
    describe_work_counted,
    speedup_over_default,
    study_ranking,
    study_trainer,
)
from autotune.views.run_time import study_run_time
from autotune.views.text import for_rich, printable
from autotune.views.trial_table import trial_table


class RunningColumn(ProgressColumn):
    """The progress bar's last column, what runs now (``running #3: mb=8 ga=1 ...``): one line, cut with
    "…" to the width the count and the elapsed time leave it, so those two are never the ones cut."""

    def __init__(self) -> None:
        # Not no_wrap: Rich narrows only the columns that may wrap before it cuts every column alike.
        super().__init__(table_column=Column(overflow="ellipsis"))

    def render(self, task: Task) -> Text:
        return Text(task.description, no_wrap=True, overflow="ellipsis")


# The trials the live table shows at most (the last ones); `autotune best --all` shows every one.
LIVE_ROWS = 30


class SearchView:
    """A live progress bar over a growing table of finished trials."""

    def __init__(self, console: Console, n_trials: int | None, ceiling_bytes: int, memory_source: str) -> None:
        self._console = console
        self._rows: list[RankedTrial] = []
        self._memory_source = memory_source
        self._ceiling = ceiling_bytes
        self._progress = Progress(
            TextColumn("[bold]trials"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            RunningColumn(),
            console=console,
        )
        self._task = self._progress.add_task("starting", total=n_trials)
        self._live = Live(self._render(), console=console, refresh_per_second=4, transient=False)
        self._trial_started = 0.0
        self._running: dict[int, TrialConfig] = {}
        # Several workers (threads) report trials; one at a time changes the rows and the bar.
        self._lock = threading.Lock()

    def _render(self, final: bool = False) -> Group:
        """The table of the last trials over the bar. While it runs on a terminal, the frame fits the terminal's
        height, its legend left for the last frame: Rich crops a taller live frame from the bottom ("..."), so the
        bar went first (30 rows and the legend's 8 lines at 80 columns in a 24-line terminal)."""
        rows = self._rows[-LIVE_ROWS:]
        if final or not self._console.is_terminal:
            return self._frame(rows, legend=True)
        fits, over = 1, len(rows) + 1  # the most rows that fit, by halves (a row may wrap over several lines)
        while over - fits > 1:
            middle = (fits + over) // 2
            if len(self._console.render_lines(self._frame(rows[-middle:]), pad=False)) <= self._console.height:
                fits = middle
            else:
                over = middle
        return self._frame(rows[-fits:])

    def _frame(self, rows: list[RankedTrial], legend: bool = False) -> Group:
        """A frame of ``rows``, the last of all (the title says so where the table leaves some out: the last 30
        always, fewer while a short terminal runs it)."""
        cut = f"; the last {len(rows)} of {len(self._rows)}" if len(rows) < len(self._rows) else ""
        title = f"Trials (ceiling {format_bytes(self._ceiling)} of {self._memory_source}{cut})"
        table = trial_table(title, rows, self._memory_source, short_notes=True, legend=legend)
        return Group(table, self._progress)

    def __enter__(self) -> SearchView:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._live.update(self._render(final=True))
        self._live.__exit__(*exc)  # type: ignore[arg-type]  # the exit info this context manager was given, passed on as is
        if not self._console.is_terminal:
            # Rich ends the last render with a newline only on a terminal (rich/live.py: Live.stop);
            # in a log or a pipe the next line would run on from the progress bar.
            self._console.line()

    def trial_started(self, number: int, config: TrialConfig) -> None:
        with self._lock:
            self._trial_started = time.monotonic()
            self._running[number] = config
            self._progress.update(self._task, description=self._running_description())

    def trial_finished(self, number: int, config: TrialConfig, result: TrialResult) -> None:
        with self._lock:
            self._running.pop(number, None)
            self._rows.append(RankedTrial(number=number, state="", config=config, result=result))
            if result.status == Status.SCREENED and self._progress.tasks[0].total is not None:
                # A screened proposal costs no trial of --trials (autotune.study._loop): the bar grows by it.
                self._progress.update(self._task, total=self._progress.tasks[0].total + 1)
            # An interrupted trial measured nothing and is queued to run again (study._record.record_interrupted,
            # study._liveness): not done. Every other status is the trial's outcome, a failure included.
            done = 0 if result.status == Status.INTERRUPTED else 1
            self._progress.update(self._task, advance=done, description=self._running_description())
            self._live.update(self._render())

    def _running_description(self) -> str:
        if len(self._running) == 1:
            number, config = next(iter(self._running.items()))
            return f"running #{number}: {config.short()}"
        return f"running {', '.join(f'#{n}' for n in sorted(self._running))}" if self._running else ""


def _trials_so_far(trials: Sequence[Any]) -> str:
    """``3 trials run so far, 2 queued``: the trials that finished, then those running (another worker's)
    and those queued (a new study's seeds) apart, since neither has run yet."""
    finished = sum(1 for trial in trials if trial.state.is_finished())
    waiting = {state: sum(1 for trial in trials if trial.state.name == state) for state in ("RUNNING", "WAITING")}
    ran = f"{finished} trial{'s' * (finished != 1)} run so far" if finished else "no trial run yet"
    return ran + "".join(f", {n} {'queued' if state == 'WAITING' else 'running'}" for state, n in waiting.items() if n)


class SearchPrinter:
    """What ``autotune search`` prints around its live view: what was prepared, the study, the notes
    before the loop, why the loop stopped, each confirmation re-run (the hooks of
    ``autotune.study.search``), and the results.

    Args:
        console: Standard output; ``err_console``: where interruptions are told.
        n_trials: Trials this invocation may run (the progress bar's total).
        confirm_top, confirm_repeats, confirm_budget: The confirmation asked for (0 leaders: none).
    """

    def __init__(
        self,
        console: Console,
        err_console: Console,
        n_trials: int,
        confirm_top: int,
        confirm_repeats: int,
        confirm_budget: float,
    ) -> None:
        self._console = console
        self._err_console = err_console
        self._n_trials = n_trials
        self._confirm_top = confirm_top
        self._confirm_repeats = confirm_repeats
        self._confirm_budget = confirm_budget
        self._study: Any = None

    def prepared(self, notes: Sequence[str], dataset: Any) -> None:
        """The request's notes (what the space filtered out; last, what MFU is measured against) and
        the user's data (a ``data.PreparedDataset``, or ``None`` for synthetic tokens)."""
        for note in notes[:-1]:
            self._console.print(f"[dim]note: {for_rich(note)}[/]")
        if dataset is not None:
            self._console.print(f"dataset {for_rich(dataset.label)}: {dataset.num_samples} samples")
        self._console.print(f"[dim]note: {for_rich(notes[-1])}[/]")

    def study_opened(self, study: Any, storage_label: str, request: Any) -> SearchView:
        """The study (an ``optuna.Study``) and what it searches (a ``SearchRequest``), in one line; how
        a new study's seeds were fitted; the live view of its trials, to run the loop in."""
        self._study = study
        workload = request.workload
        if all(t.state.name == "WAITING" for t in study.trials):  # a new study: say how its seeds were fitted
            for note in study.user_attrs.get(schema.STUDY_SEED_NOTES, []):
                self._console.print(f"[dim]note: {for_rich(note)}[/]")
        ranks = workload.devices_per_trial
        rank_ceiling = " a rank" if ranks_sharing(workload.device.kind, ranks) > 1 else ""
        self._console.print(
            f"study [bold]{for_rich(study.study_name)}[/] in {for_rich(storage_label)}: {workload.model.name} ({workload.model.num_params / 1e6:.1f} M "
            f"params, {workload.model.task}) on {', '.join(d.label for d in request.worker_devices)} ({workload.device.name}), "
            f"seq len {workload.seq_len}, ceiling {format_bytes(workload.ceiling_bytes)}{rank_ceiling}, space of {request.space.size} configs, "
            f"{_trials_so_far(study.trials)}"
        )
        # A trial of several ranks records its largest rank's peak (runner/_ranks.py).
        tree = "the trial's process tree" if ranks == 1 else "each rank's process tree"
        probe_source = (
            f"peak RSS of {tree}"
            if workload.device.kind == "cpu"
            else "peak reserved + outside-allocator device memory"
        )
        if ranks > 1:
            probe_source += f", the largest of its {ranks} ranks'"
        return SearchView(self._console, self._n_trials, workload.ceiling_bytes, probe_source)

    def note(self, line: str) -> None:
        self._console.print(f"note: {for_rich(line)}")

    def loop_ended(self, reason: str | None) -> None:
        """Why the search stopped early, if it did, how many distinct configs it measured, the confirmation to come."""
        if reason:
            self._console.print(f"search done: {reason}", markup=False, highlight=False)
        self._console.print(describe_distinct(self._study.get_trials(deepcopy=False)), markup=False, highlight=False)
        if self._confirm_top > 0:
            default = comparable_hf_default(judged_trials(self._study.get_trials(deepcopy=False)))
            beside = default_beside(self._study, None if default is None else default.number)
            self._console.print(
                f"confirming: re-running the leader and those of the top {self._confirm_top} feasible configs within "
                f"the measured noise of it{beside}, interleaved, up to {self._confirm_repeats} times each, until "
                f"their order is settled; after the first round, within {self._confirm_budget:.0%} of the search's "
                "time so far",
                soft_wrap=True,  # one line: the terminal wraps it, and a reader (or a test) finds it whole
            )

    def confirm_run(self, round_index: int, number: int, result: TrialResult) -> None:
        figure = f"{result.samples_per_s:.1f} samples/s" if result.samples_per_s else result.error[:60]
        self._console.print(
            f"  round {round_index + 1}/{self._confirm_repeats}: #{number} {result.status}, {for_rich(figure)}"
        )

    def interrupted(self) -> None:
        self._err_console.print(
            f"interrupted: running trials were stopped, recorded as interrupted and queued to run again. "
            f"{describe_standing(self._study)}. To resume, run the same command again.",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )

    def confirmation_interrupted(self) -> None:
        self._err_console.print(
            f"confirmation interrupted: none of its re-runs is recorded; {describe_ranking_basis(self._study)}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )

    def results(self) -> None:
        """What the confirmation re-ran and cost, the ranking, the speedup over the HF default, whether
        the winner trains as the default does, and last, where the search's wall time went."""
        if self._confirm_top > 0:
            line = describe_confirmation(self._study)
            if line:
                self._console.print(line, markup=False, highlight=False, soft_wrap=True)
        print_ranking(self._console, self._study, top=5)
        print_speedup(self._console, self._study)
        print_winner_loss(self._console, self._study)
        spent = self._study.user_attrs.get(schema.STUDY_TIME_SPENT)
        if spent:
            self._console.print(TimeSpent.from_dict(spent).line(), markup=False, highlight=False, soft_wrap=True)


def print_ranking(
    console: Console, study: Any, top: int, epochs: float | None = None, price_per_hour: float | None = None
) -> None:
    """The feasible trials of a study (an ``optuna.Study``), fastest first, the winner in words and the
    whole run's projected wall time (:func:`autotune.views.run_time.study_run_time`)."""
    ranking = study_ranking(study)
    if not ranking:
        console.print(f"study {for_rich(repr(study.study_name))}: no feasible trial yet (see `autotune best --all`)")
        return
    source = ranking[0].result.memory_source if ranking[0].result else ""
    console.print(trial_table(ranking_title(study.study_name, ranking), ranking[:top], source))
    console.print(describe_winner(ranking))
    console.print(study_run_time(study, epochs, price_per_hour), markup=False, highlight=False, soft_wrap=True)
    if (counted := describe_work_counted(study)) is not None:
        console.print(counted, markup=False, highlight=False, soft_wrap=True)


def ranking_title(study_name: str, ranking: Sequence[RankedTrial]) -> str:
    """The ranking table's title: its order as :func:`autotune.views.ranking.feasible_ranking` makes it,
    where a single measurement, however fast, is never put above the confirmed leader."""
    title = f"Feasible configurations of {for_rich(study_name)}, fastest first"
    if any(row.confirmed for row in ranking) and not all(row.confirmed for row in ranking):
        title += "; unconfirmed single measurements below the confirmed leader"
    return title


def print_all_trials(console: Console, study: Any) -> None:
    """Every trial of a study, in the order they ran, whatever its status (``autotune best --all``)."""
    rows = all_trials(study.get_trials(deepcopy=False), confirmations_of(study))
    console.print(trial_table(f"All trials of {for_rich(study.study_name)}", rows))
    console.print(describe_distinct(study.get_trials(deepcopy=False)), markup=False, highlight=False)


def print_speedup(console: Console, study: Any) -> None:
    """The winner's speedup over the HF default ``TrainingArguments`` trial, or why there is none."""
    speedup = speedup_over_default(study.get_trials(deepcopy=False), confirmations_of(study))
    if speedup is None:
        return
    best = f"#{speedup.best_trial} {speedup.best_config.short()} at {speedup.best_samples_per_s:.1f} samples/s"
    trainer = study_trainer(study)
    default = f"{trainer.default_arguments_words} (#{speedup.default_trial})"
    over = f"speedup over {trainer.baseline_words}"
    if speedup.default_moved:  # the space could not hold the default: its seed ran the nearest config
        over = f"speedup over the nearest config to the {trainer.baseline_words} in this space"
        default = f"that config (#{speedup.default_trial}: {', '.join(speedup.default_moved)})"
    if speedup.ratio is None:
        if speedup.default_status in FAILED_STATUSES:  # no figure: it failed (a timeout, a crash), say why
            why = f"failed ({speedup.default_status}: {printable(speedup.default_error)})"
        else:
            why = f"did not fit ({speedup.default_status})"
        console.print(f"{over}: n/a: {default} {why}; winner {best}", markup=False, highlight=False, soft_wrap=True)
        return
    tie = ", within noise of the default" if speedup.within_noise else ""
    if speedup.not_told_apart and not speedup.within_noise:
        tie = ", not told apart from the default before the confirmation's budget ran out"
    console.print(
        f"{over}: [bold]{speedup.ratio:.2f}x[/]{tie} (winner {best}; {default} at "
        f"{speedup.default_samples_per_s:.1f} samples/s; {speedup.compared}, same ceiling)"
    )


def print_winner_loss(console: Console, study: Any) -> None:
    """Whether the winner trains as the HF default does: their losses over the same steps, in words."""
    ranking = study_ranking(study)
    if not ranking or ranking[0].result is None:
        return
    baseline = study_trainer(study).baseline_words
    loss = winner_loss(study.get_trials(deepcopy=False), ranking[0].number, ranking[0].result, baseline)
    console.print(loss.describe(), markup=False, highlight=False, soft_wrap=True)
    curve = loss.curve_text()
    if curve is not None:
        console.print(curve, markup=False, highlight=False, soft_wrap=True)
    faster = [
        (n, r)
        for n, r in diverged_trials(study.get_trials(deepcopy=False))
        if r.samples_per_s > ranking[0].samples_per_s
    ]
    for number, result in faster:
        console.print(
            f"not ranked: #{number} ran at {result.samples_per_s:.1f} samples/s but does not train "
            f"({printable(result.error) or f'loss far above the {baseline}'})",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
