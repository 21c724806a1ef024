"""The figures of `autotune report` (views/report.py assembles them into one page): each one built from a
study's trials, with the same colour per status everywhere."""

from __future__ import annotations

import dataclasses
import datetime
import html
import math
import warnings
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import AutotuneError
from autotune.levers import TrialConfig
from autotune.result import (
    INFEASIBLE_STATUSES,
    RAN_NORMALLY_STATUSES,
    UNFINISHED_LABELS,
    Status,
    TrialResult,
    accumulation_note,
    in_order,
    judged_trials,
    winner_loss,
)
from autotune.storage import schema
from autotune.storage.schema import METRIC_NAME
from autotune.units import GiB, format_bytes
from autotune.views.ranking import (
    RankedTrial,
    confirmation_label,
    ranked_result,
)

try:  # an optional part (pyproject's [report] extra): the search never imports this module
    import plotly.graph_objects as go
    from plotly.offline import get_plotlyjs  # noqa: F401 - for views/report.py: a missing plotly is the one error above
    from plotly.subplots import make_subplots
except ImportError as missing:
    raise AutotuneError(
        "autotune report needs plotly: pip install 'autotune[report]' (or pip install plotly)"
    ) from missing

# One colour per trial status and unfinished label, the same in every figure (close to the terminal
# table's styles); a test checks both maps cover exactly autotune.result's vocabulary.
STATUS_COLORS: dict[str, str] = {
    Status.OK: "#2ca02c",
    Status.OVER_CEILING: "#ff7f0e",
    Status.OOM: "#d62728",
    Status.SCREENED: "#9467bd",
    Status.PRUNED: "#17becf",
    Status.DIVERGED: "#000000",
    Status.RECOMPILING: "#bc80bd",
    Status.TIMEOUT: "#8c564b",
    Status.CRASH: "#7f0000",
    Status.ERROR: "#e377c2",
    Status.INTERRUPTED: "#7f7f7f",
    Status.COMPILE_TIMEOUT: "#c49c94",
    UNFINISHED_LABELS["RUNNING"]: "#1f77b4",
    UNFINISHED_LABELS["WAITING"]: "#bcbd22",
}
STATUS_MEANING: dict[str, str] = {
    Status.OK: "ran and fits under the ceiling",
    Status.OVER_CEILING: "ran, but its peak memory is above the ceiling",
    Status.OOM: "ran out of memory",
    Status.SCREENED: "predicted not to fit; not run",
    Status.PRUNED: "stopped early: clearly slower than the best",
    Status.DIVERGED: "ran, but does not train: loss non-finite or far above the HF default's",
    Status.RECOMPILING: "stopped: torch.compile compiled again at step after step (batches of new shapes)",
    Status.TIMEOUT: "killed at the trial timeout",
    Status.COMPILE_TIMEOUT: "killed while torch.compile still compiled, at the compile timeout",
    Status.CRASH: "the child process crashed",
    Status.ERROR: "failed with an error",
    Status.INTERRUPTED: "stopped by the user or a dead worker",
    UNFINISHED_LABELS["RUNNING"]: "still running",
    UNFINISHED_LABELS["WAITING"]: "waiting to run (a seed or a re-run)",
}
RANKED_ROWS = 50


@dataclasses.dataclass(frozen=True)
class TrialRow:
    """One trial as the figures see it."""

    number: int
    status: str
    config: TrialConfig
    params: dict[str, Any]
    result: TrialResult | None
    started: datetime.datetime | None
    finished: datetime.datetime | None
    reused: bool

    @property
    def peak_gib(self) -> float:
        return self.result.peak_memory_bytes / GiB if self.result else 0.0

    @property
    def samples_per_s(self) -> float:
        return self.result.samples_per_s if self.result else 0.0

    def hover(self) -> str:
        lines = [f"trial {self.number}: {self.status}", self.config.short()]
        if self.result is not None:
            if self.result.samples_per_s > 0:
                lines.append(f"{self.result.samples_per_s:.2f} samples/s, {self.result.model_tflops:.4g} model TFLOPs")
            if self.result.peak_memory_bytes:
                lines.append(f"peak memory {format_bytes(self.result.peak_memory_bytes)}")
            if self.result.peak_batch:
                lines.append(f"peak set by {html.escape(self.result.peak_batch)}")
            if self.result.error:
                lines.append(html.escape(self.result.error[:120]))
        if self.reused:
            lines.append("(config measured before: result copied)")
        return "<br>".join(lines)


def trial_rows(trials: list[FrozenTrial]) -> list[TrialRow]:
    """One row per trial in number order, as judged (:func:`autotune.result._loss.judged_trials`)."""
    rows = []
    for trial in sorted(judged_trials(trials), key=lambda t: t.number):
        result = TrialResult.from_trial(trial)
        status = result.status if result is not None else UNFINISHED_LABELS.get(trial.state.name, Status.ERROR)
        rows.append(
            TrialRow(
                number=trial.number,
                status=status,
                config=TrialConfig.from_params(trial.params),
                params=dict(trial.params),
                result=result,
                started=trial.datetime_start,
                finished=trial.datetime_complete,
                reused=schema.TRIAL_REUSED_FROM in trial.user_attrs,
            )
        )
    return rows


def speed_memory_figure(
    rows: list[TrialRow], ceiling_bytes: int, memory_label: str, ranking: list[RankedTrial] | None = None
) -> go.Figure:
    """samples/s against peak memory: the ceiling, the Pareto front of fitting configs, OOMs marked,
    and the confirmed leaders at the median of their re-runs (bars: slowest to fastest re-run)."""
    ceiling_gib = ceiling_bytes / GiB
    figure = go.Figure()
    measured = [r for r in rows if not r.reused and r.result is not None]
    for status in in_order(RAN_NORMALLY_STATUSES):
        group = [r for r in measured if r.status == status and r.samples_per_s > 0 and r.peak_gib > 0]
        if group:
            figure.add_trace(
                go.Scatter(
                    x=[r.peak_gib for r in group],
                    y=[r.samples_per_s for r in group],
                    mode="markers",
                    name=f"{status} ({STATUS_MEANING[status]})",
                    marker={"color": STATUS_COLORS[status], "size": 10},
                    text=[r.hover() for r in group],
                    hovertemplate="%{text}<extra></extra>",
                )
            )
    for status in in_order(INFEASIBLE_STATUSES - RAN_NORMALLY_STATUSES):  # no speed measured to draw
        group = [r for r in measured if r.status == status]
        if group:
            # Their real need is unknown: drawn at the peak seen before failing, or at the ceiling.
            figure.add_trace(
                go.Scatter(
                    x=[r.peak_gib if r.peak_gib > 0 else ceiling_gib for r in group],
                    y=[0.0] * len(group),
                    mode="markers",
                    name=f"{status} ({STATUS_MEANING[status]}; drawn at 0 samples/s)",
                    marker={"color": STATUS_COLORS[status], "size": 13, "symbol": "x"},
                    text=[r.hover() for r in group],
                    hovertemplate="%{text}<extra></extra>",
                )
            )
    front = pareto_front(
        [(r.peak_gib, r.samples_per_s, r.number) for r in measured if r.status == Status.OK and r.samples_per_s > 0]
    )
    if front:
        figure.add_trace(
            go.Scatter(
                x=[p[0] for p in front],
                y=[p[1] for p in front],
                mode="lines",
                line={"shape": "hv", "dash": "dot", "color": "#2ca02c"},
                name="Pareto front: fastest for its memory",
                hoverinfo="skip",
            )
        )
    confirmed = [r for r in ranking or [] if r.confirmed and r.confirmed_samples_per_s is not None]
    if confirmed:
        runs = [(r.confirmation or {}).get("runs_samples_per_s") or [r.samples_per_s] for r in confirmed]
        figure.add_trace(
            go.Scatter(
                x=[r.peak_memory_bytes / GiB for r in confirmed],
                y=[r.samples_per_s for r in confirmed],
                mode="markers",
                name="confirmed: median of interleaved re-runs (bar: slowest to fastest)",
                marker={"symbol": "diamond-open", "size": 14, "color": "#1f77b4", "line": {"width": 2}},
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": [max(run) - r.samples_per_s for r, run in zip(confirmed, runs)],
                    "arrayminus": [r.samples_per_s - min(run) for r, run in zip(confirmed, runs)],
                },
                text=[
                    f"trial {r.number} confirmed: {r.samples_per_s:.2f} samples/s, median of {len(run)} re-runs"
                    for r, run in zip(confirmed, runs)
                ],
                hovertemplate="%{text}<extra></extra>",
            )
        )
    figure.add_vline(
        x=ceiling_gib,
        line={"color": "#d62728", "dash": "dash"},
        annotation_text=f"ceiling {format_bytes(ceiling_bytes)}",
        annotation_position="top left",
    )
    figure.update_layout(
        title="Throughput against peak memory",
        xaxis_title=f"peak memory, GiB ({memory_label})",
        yaxis_title="samples/s (steady-state median per optimizer step)",
        legend={"orientation": "h", "y": -0.25},
        height=520,
    )
    return figure


def history_figure(trials: list[FrozenTrial]) -> go.Figure:
    """Optuna's history plot of the judged trials (its best-so-far line reads their constraints)."""
    judged = optuna.create_study(direction="maximize")
    judged.add_trials([t for t in judged_trials(trials) if t.state.is_finished()])
    figure = optuna.visualization.plot_optimization_history(judged, target_name=METRIC_NAME)
    figure.update_layout(title=f"Optimization history ({METRIC_NAME}; infeasible trials have value 0)", height=450)
    return figure


def importance_figures(study: optuna.Study, rows: list[TrialRow]) -> list[go.Figure]:
    """Lever importances for speed (over configs that fit) and for peak memory (over configs that ran)."""
    by_number = {t.number: t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))}
    fitting = [by_number[r.number] for r in rows if r.status == Status.OK and not r.reused and r.number in by_number]
    ran = [by_number[r.number] for r in rows if r.peak_gib > 0 and not r.reused and r.number in by_number]
    return [
        _importance_figure(fitting, None, f"{METRIC_NAME} (configs that fit)"),
        _importance_figure(ran, _peak_gib, "peak memory, GiB (configs that ran)"),
    ]


def _peak_gib(trial: FrozenTrial) -> float:
    result = TrialResult.from_trial(trial)
    return result.peak_memory_bytes / GiB if result is not None else 0.0


def _importance_figure(trials: list[FrozenTrial], target: Any, target_name: str) -> go.Figure:
    title = f"Lever importance for {target_name}: {len(trials)} trials"
    varied = {
        name for name in {p for t in trials for p in t.params} if len({repr(t.params.get(name)) for t in trials}) > 1
    }
    if len(trials) < 3 or not varied:
        return empty_figure(title, f"needs at least 3 such trials with different levers (have {len(trials)})")
    copy = optuna.create_study(direction="maximize")
    copy.add_trials(trials)
    with warnings.catch_warnings():
        # PED-ANOVA tells a custom target is taken as "lower is better": what peak memory wants.
        warnings.filterwarnings("ignore", message="PedAnovaImportanceEvaluator computes the importances")
        figure = optuna.visualization.plot_param_importances(
            copy, target=target, target_name=target_name, params=sorted(varied)
        )
    figure.update_layout(title=title, height=380)
    return figure


def lever_effects_figure(rows: list[TrialRow], space: dict[str, list[Any]]) -> go.Figure:
    """One panel per searched lever: samples/s of each choice (configs that fit), and choices that did not fit."""
    measured = [r for r in rows if not r.reused and r.result is not None]
    levers = [
        name for name in (space or {}) if len({repr(r.params.get(name)) for r in measured if name in r.params}) > 1
    ]
    if not levers:
        return empty_figure("Lever effects", "no lever took two values yet")
    columns = min(3, len(levers))
    figure = make_subplots(rows=math.ceil(len(levers) / columns), cols=columns, subplot_titles=levers)
    for index, lever in enumerate(levers):
        row, column = index // columns + 1, index % columns + 1
        fitting = [r for r in measured if r.status == Status.OK and lever in r.params]
        failed = [r for r in measured if r.status in INFEASIBLE_STATUSES and lever in r.params]
        figure.add_trace(
            go.Box(
                x=[str(r.params[lever]) for r in fitting],
                y=[r.samples_per_s for r in fitting],
                boxpoints="all",
                jitter=0.4,
                pointpos=0,
                name="fits: samples/s",
                marker={"color": STATUS_COLORS[Status.OK]},
                legendgroup="ok",
                showlegend=index == 0,
                text=[r.hover() for r in fitting],
                hovertemplate="%{text}<extra></extra>",
            ),
            row=row,
            col=column,
        )
        if failed:
            figure.add_trace(
                go.Scatter(
                    x=[str(r.params[lever]) for r in failed],
                    y=[0.0] * len(failed),
                    mode="markers",
                    marker={"color": [STATUS_COLORS[r.status] for r in failed], "symbol": "x", "size": 11},
                    name="did not fit (OOM, over ceiling, screened)",
                    legendgroup="infeasible",
                    showlegend=not any(t.legendgroup == "infeasible" for t in figure.data),
                    text=[r.hover() for r in failed],
                    hovertemplate="%{text}<extra></extra>",
                ),
                row=row,
                col=column,
            )
        figure.update_xaxes(
            type="category", categoryorder="array", categoryarray=[str(c) for c in space[lever]], row=row, col=column
        )
        figure.update_yaxes(title_text="samples/s" if column == 1 else None, rangemode="tozero", row=row, col=column)
    figure.update_layout(
        title="Lever effects: samples/s by choice (configs that fit); × = did not fit",
        height=330 * math.ceil(len(levers) / columns),
        legend={"orientation": "h", "y": -0.08},
    )
    return figure


def timeline_figure(rows: list[TrialRow]) -> go.Figure:
    """One bar per trial from its start to its end, coloured by how it ended."""
    figure = go.Figure()
    now = datetime.datetime.now()
    timed = [r for r in rows if r.started is not None]
    if not timed:
        return empty_figure("Timeline of trials", "no trial has started yet")
    for status in STATUS_COLORS:
        group = [r for r in timed if r.status == status]
        if not group:
            continue
        starts = [r.started for r in group if r.started is not None]  # every one: `timed` holds started rows
        durations_ms = [max(((r.finished or now) - s).total_seconds() * 1000.0, 1.0) for r, s in zip(group, starts)]
        figure.add_trace(
            go.Bar(
                base=[s.isoformat() for s in starts],
                x=durations_ms,
                y=[f"#{r.number}" for r in group],
                orientation="h",
                name=f"{status} ({sum(1 for r in rows if r.status == status)})",
                marker={"color": STATUS_COLORS[status]},
                text=[r.hover() for r in group],
                textposition="none",
                hovertemplate="%{text}<extra></extra>",
            )
        )
    figure.update_layout(
        title="Timeline of trials (colour: how each ended)",
        barmode="overlay",
        xaxis={"type": "date", "title": "wall-clock time"},
        yaxis={
            "title": "trial",
            "autorange": "reversed",
            "type": "category",
            "categoryorder": "array",
            "categoryarray": [f"#{r.number}" for r in timed],
        },
        height=max(300, 60 + 22 * len(timed)),
    )
    return figure


def ranking_table_figure(ranking: list[RankedTrial]) -> go.Figure:
    """The feasible configurations, fastest first, every figure with its unit."""
    if not ranking:
        return empty_figure("Ranked configurations", "no configuration fits under the ceiling yet")
    header = [
        "rank",
        "trial",
        "config",
        "samples/s",
        "model TFLOPs",
        "hardware TFLOPs",
        "MFU",
        "peak memory",
        "step-time CV",
    ]
    cells: list[list[str]] = [[] for _ in header]
    shown = ranking[:RANKED_ROWS]
    for rank, row in enumerate(shown, start=1):
        result = ranked_result(row) or TrialResult(status=Status.OK)
        values = [
            str(rank),
            str(row.number),
            " ".join(filter(None, [row.config.short(), accumulation_note(result)])),
            f"{result.samples_per_s:.2f}{confirmation_label(row)}",
            f"{result.model_tflops:.4g}",
            f"{result.hardware_tflops:.4g}",
            f"{result.mfu:.1%}" if result.mfu is not None else "-",
            format_bytes(result.peak_memory_bytes),
            f"{result.step_time_cv:.1%}",
        ]
        for column, value in zip(cells, values):
            column.append(value)
    figure = go.Figure(
        go.Table(
            columnwidth=[40, 45, 260, 200, 95, 110, 60, 95, 90],
            header={"values": header, "fill_color": "#e8eef7", "align": "left", "height": 30},
            cells={"values": cells, "align": "left", "height": 28},
        )
    )
    figure.update_layout(
        title=f"Ranked configurations (fit under the ceiling), fastest first: {len(shown)} of {len(ranking)}",
        height=130 + 30 + 28 * len(shown),
        margin={"t": 70, "b": 20},
    )
    return figure


def loss_figure(
    trials: list[FrozenTrial], ranking: list[RankedTrial], baseline: str = "HF default"
) -> tuple[str, go.Figure]:
    """The winner's training loss beside the trainer's default's (``baseline``: its name in words, the study's
    trainer's ``baseline_words``, as the search's summary names it), step by step, and whether they agree."""
    title = f"Training loss: the winner beside the {baseline}"
    if not ranking or ranking[0].result is None:
        return "No winner yet: no loss to compare.", empty_figure(title, "no configuration fits under the ceiling yet")
    loss = winner_loss(trials, ranking[0].number, ranking[0].result, baseline)
    figure = go.Figure()
    curves = [(f"winner #{loss.winner_trial}", loss.winner, "#2ca02c")]
    if loss.default is not None and loss.default_trial != loss.winner_trial:
        curves.append((f"{baseline} #{loss.default_trial}", loss.default, "#1f77b4"))
    for name, result, colour in curves:
        steps = list(range(1, len(result.loss_curve) + 1))
        figure.add_trace(
            go.Scatter(
                x=steps,
                y=result.loss_curve,
                mode="lines+markers",
                name=name,
                line={"color": colour},
                marker={"size": 4},
            )
        )
    measured_from = max(result.loss_measured_from for _, result, _ in curves)
    if measured_from > 1:
        figure.add_vrect(
            x0=0.5,
            x1=measured_from - 0.5,
            fillcolor="#cccccc",
            opacity=0.3,
            line_width=0,
            annotation_text="warm-up (not measured)",
            annotation_position="top left",
        )
    figure.update_layout(title=title, xaxis={"title": "optimizer step"}, yaxis={"title": "training loss"}, height=420)
    return loss.describe() + ".", figure


def empty_figure(title: str, reason: str) -> go.Figure:
    figure = go.Figure()
    figure.add_annotation(text=reason, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font={"size": 15})
    figure.update_layout(title=title, height=220, xaxis={"visible": False}, yaxis={"visible": False})
    return figure


def pareto_front(points: list[tuple[float, float, int]]) -> list[tuple[float, float, int]]:
    """The (memory, speed, trial) points no other point beats on both: less memory and more speed.

    Sorted by memory; each point on the front is faster than every point that uses less memory.
    """
    front: list[tuple[float, float, int]] = []
    for memory, speed, number in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or speed > front[-1][1]:
            front.append((memory, speed, number))
    return front
