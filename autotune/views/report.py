"""``autotune report``: one self-contained HTML page of plotly figures about a study.

Figures: samples/s against peak memory (ceiling line, Pareto front, OOMs marked), the optimization
history and lever importances (``optuna.visualization``), per-lever effects, a timeline of trials
(OOMs and failures visible), and the ranked table. plotly.js is inlined once, so the page works
offline and can be mailed or attached to a ticket.
"""

from __future__ import annotations

import html
from collections import Counter

import optuna
from optuna.trial import TrialState

from autotune.errors import AutotuneError
from autotune.result import (
    memory_source_description,
)
from autotune.spec.files import Destination
from autotune.storage import schema
from autotune.storage.schema import METRIC_NAME
from autotune.units import format_bytes
from autotune.views._report_figures import (
    STATUS_COLORS,
    STATUS_MEANING,
    TrialRow,
    get_plotlyjs,
    go,
    history_figure,
    importance_figures,
    lever_effects_figure,
    loss_figure,
    ranking_table_figure,
    speed_memory_figure,
    timeline_figure,
    trial_rows,
)
from autotune.views.export import (
    compile_environment,
    export_notes,
    exported_as,
    render,
    tool_winner,
    winner_arguments,
)
from autotune.views.ranking import (
    study_ranking,
    study_trainer,
    winner_summary,
)
from autotune.views.run_time import study_run_time

__all__ = [
    "STATUS_COLORS",
    "STATUS_MEANING",
    "TrialRow",
    "report_figures",
    "report_html",
    "trial_rows",
    "write_report",
]

PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}


def report_figures(study: optuna.Study) -> list[tuple[str, go.Figure]]:
    """Every figure of the report, with a one-line caption each."""
    attrs = study.user_attrs
    trials = study.get_trials(deepcopy=False)
    rows = trial_rows(trials)
    sources = sorted({r.result.memory_source for r in rows if r.result and r.result.memory_source})
    memory_label = ", ".join(memory_source_description(s) for s in sources) or "peak memory"
    ranking = study_ranking(study)
    speed_memory = speed_memory_figure(rows, int(attrs.get(schema.STUDY_CEILING_BYTES, 0)), memory_label, ranking)
    figures: list[tuple[str, go.Figure]] = [
        (
            "Each point is a measured trial (one measurement). Configs right of the ceiling do not fit; × marks out-of-memory "
            "(at 0 samples/s). The dotted line joins the fastest config for each memory budget. Diamonds: leaders re-measured "
            "at the end of the search, which the ranking uses.",
            speed_memory,
        ),
    ]
    completed = [t for t in trials if t.state == TrialState.COMPLETE]
    if completed:
        figures.append(
            (
                f"{METRIC_NAME} per trial; infeasible trials (did not fit) are grey, the line is the best feasible so far.",
                history_figure(trials),
            )
        )
    importance_speed, importance_memory = importance_figures(study, rows)
    figures += [
        (
            "Which levers explain the speed of configs that fit (PED-ANOVA, Optuna's default evaluator).",
            importance_speed,
        ),
        ("Which levers explain low peak memory.", importance_memory),
        (
            "samples/s of each choice of each lever; × marks configs with that choice that did not fit.",
            lever_effects_figure(rows, attrs.get(schema.STUDY_SPACE) or {}),
        ),
        (
            "When each trial ran and how it ended: OOMs, over-ceiling, failures and timeouts stand out by colour.",
            timeline_figure(rows),
        ),
        (
            "Only configs that ran and fit under the ceiling are ranked; confirmed figures are re-measured medians.",
            ranking_table_figure(ranking),
        ),
        loss_figure(trials, ranking, study_trainer(study).baseline_words),
    ]
    return figures


def report_html(study: optuna.Study, epochs: float | None = None, price_per_hour: float | None = None) -> str:
    """The whole page: a header on the study and its winner (with the whole run's projected wall time,
    :func:`autotune.views.run_time.study_run_time`), then every figure, plotly.js inlined once."""
    attrs = study.user_attrs
    identity = attrs.get(schema.STUDY_IDENTITY) or {}
    trials = study.get_trials(deepcopy=False)
    statuses = Counter(row.status for row in trial_rows(trials))
    ranking = study_ranking(study)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>autotune report: {html.escape(study.study_name)}</title>",
        "<style>body{font-family:system-ui,sans-serif;max-width:1200px;margin:1em auto;padding:0 1em;color:#222}"
        "pre{background:#f4f4f4;padding:.6em;overflow-x:auto;white-space:pre-wrap}"
        "section{margin:1.5em 0}.caption{color:#555;margin:.2em 0}</style>",
        f"<script>{get_plotlyjs()}</script>",
        "</head><body>",
        f"<h1>autotune report: {html.escape(study.study_name)}</h1>",
        "<p>",
        f"Model <b>{html.escape(str(identity.get('model', '?')))}</b> ({html.escape(str(identity.get('task', '?')))}), "
        f"sequence length {html.escape(str(identity.get('seq_len', '?')))}, device {html.escape(str(identity.get('device', '?')))}; "
        f"memory ceiling <b>{format_bytes(attrs.get('ceiling_bytes', 0))}</b>. "
        f"{len(trials)} trials: {html.escape(', '.join(f'{s} {n}' for s, n in sorted(statuses.items())) or 'none')}.",
        "</p><p>",
        f"<b>{METRIC_NAME}</b>: useful work per second, 6N + 12·L·h·s FLOPs per token, N the parameters a token multiplies (a mixture of experts: k of its E routed experts; PaLM, appendix B; 4N + 6N_adapter + 12·L·h·s under --peft), the ranking metric; "
        "hardware TFLOPs also count checkpointing's recomputed forward. samples/s: steady-state median over whole "
        "optimizer steps, warm-up excluded. MFU: model TFLOPs over the datasheet peak of the dtype used.",
        "</p>",
    ]
    if ranking:
        best = ranking[0]
        parts += [
            f"<h2>Winner: trial {best.number}</h2>",
            f"<p>{html.escape(winner_summary(best))}.</p>",
            f"<p>{html.escape(study_run_time(study, epochs, price_per_hour) or '')}.</p>",
            *(f"<p>Note: {html.escape(note)}.</p>" for note in export_notes(best, study)),
        ]
        for fmt, command in (("json", "autotune export"), ("cli", "autotune export --format cli")):
            # What `autotune export` writes, through its own rendering (an SFT or DPO study's arguments are its
            # config class's, and its flags TRL's), and what they are, in its words.
            arguments = winner_arguments(study, fmt)
            text = render(arguments, fmt, tool=tool_winner(study, arguments, compile_environment(best)))
            parts += [
                f"<p><code>{command}</code> ({html.escape(exported_as(study, fmt))}):</p>",
                f"<pre>{html.escape(text)}</pre>",
            ]
    else:
        parts.append("<h2>No configuration fits under the ceiling yet</h2>")
    for index, (caption, figure) in enumerate(report_figures(study)):
        div = figure.to_html(full_html=False, include_plotlyjs=False, div_id=f"figure-{index}", config=PLOTLY_CONFIG)
        parts += [f'<section><p class="caption">{html.escape(caption)}</p>', div, "</section>"]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_report(
    study: optuna.Study, destination: Destination, epochs: float | None = None, price_per_hour: float | None = None
) -> None:
    """Write :func:`report_html` to ``destination`` (``-``: standard output), under its one rule.

    Raises:
        AutotuneError: The study has no trials, or the destination's rule refuses it or it cannot be written.
    """
    if not study.get_trials(deepcopy=False):
        raise AutotuneError(f"study {study.study_name!r} has no trials yet: run `autotune search` first")
    destination.write({destination.out: report_html(study, epochs, price_per_hour)})
