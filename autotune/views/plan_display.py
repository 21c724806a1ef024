"""What ``autotune estimate`` prints: the planner's tables, its predicted winner and run time, what would fit
(``autotune devices`` prints through ``views/devices_display.py``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from autotune.estimate import (
    EstimateRow,
    FitAdvice,
    MemoryEstimate,
    MemoryFit,
    SettingRow,
    SpeedEstimate,
    SpeedFit,
    by_setting,
    estimate_json,
    plan_rows,
    predicted_winner,
    speed_expected_error,
    what_would_fit,
)
from autotune.levers import LEVERS, TrialConfig
from autotune.levers.batch import GLOBAL_BATCH_LEVERS
from autotune.spec.ceiling import fits, ranks_sharing
from autotune.spec.models import ModelSpec
from autotune.units import format_bytes
from autotune.views.run_time import predicted_run_time_of
from autotune.views.text import for_rich
from autotune.views.trial_table import format_tflops

HOST_COLUMN = "host RAM (offload)"
# The throughput prior's columns (autotune.estimate._speed), and what they mean.
SPEED_COLUMNS = ("samples/s", "tokens/s", "model TFLOPs", "MFU")
SPEED_CAPTION = (
    "samples/s, tokens/s, model TFLOPs, MFU: predicted, not measured: the throughput prior's prediction (compute over the matmul peak x achievable fraction, memory-bound "
    "work over the bandwidth, several ranks' collectives over the bus between them, DeepSpeed's own work under ZeRO, overhead; docs/estimator.md); tokens/s counts real tokens; MFU against the datasheet "
    "(GPU) or measured (CPU, MFU*) peak, '-' where none is known; a pass the trainer runs before training (a "
    "precomputed reference) is counted over the run's passes over the data, as a trial counts it. Rows that fit "
    "come first, fastest first."
)


def speed_cells(speed: SpeedEstimate | None) -> list[str]:
    """A row's predicted samples/s, tokens/s, model TFLOPs and MFU ('-' where not predicted)."""
    if speed is None:
        return ["-"] * len(SPEED_COLUMNS)
    mfu = f"{speed.mfu:.1%}" if speed.mfu is not None else "-"
    return [f"{speed.samples_per_s:.3g}", f"{speed.tokens_per_s:,.0f}", format_tflops(speed.model_tflops), mfu]


def winner_line(rows: Sequence[EstimateRow], speed: SpeedFit) -> str:
    """The predicted winner in one line: the config that fits with the highest predicted model TFLOPs, its
    predicted rates, and the prediction's expected error."""
    winner = predicted_winner(rows)
    if winner is None or winner.speed is None:
        return f"predicted winner: none (no config predicted to fit, or no peak known for {speed.device_kind})"
    s = winner.speed
    mfu = f", MFU {s.mfu:.1%}" if s.mfu is not None else ""
    return (
        f"predicted winner: {winner.config.short()}: {s.samples_per_s:.3g} samples/s, {s.tokens_per_s:,.0f} tokens/s, "
        f"{format_tflops(s.model_tflops)} model TFLOPs{mfu} (predicted, not measured; expected error: "
        f"{speed_expected_error(speed)})"
    )


def shows_host_memory(estimates: Sequence[MemoryEstimate]) -> bool:
    """Whether a table needs the host column: some config offloads (ZeRO, TRL's activation offloading)."""
    return any(estimate.host_bytes for estimate in estimates)


def host_memory_note(device_kind: str, host_ceiling_bytes: int | None = None) -> str:
    """What the host column means where it is shown (``autotune estimate``), and the host RAM it was judged by."""
    what = "host RAM (offload): what DeepSpeed ZeRO offload and TRL's activation offloading keep in host memory"
    if device_kind == "cpu":
        what += "; on the CPU the host is the device, so the predicted peak already holds it"
    else:
        what += " per rank, beside the device's peak (a trial's ranks share the host)"
    if host_ceiling_bytes is None:
        return f"{what}; not judged against this machine's RAM (the GPU's host is not this one)"
    return f"{what}; a config whose ranks together need more than {format_bytes(host_ceiling_bytes)} there does not fit"


def trained_name(model: ModelSpec) -> str:
    """The model as every trial trains it: its name, and its adapters under ``--peft``."""
    return model.name if model.peft is None else f"{model.name} with {model.peft.describe()}"


def estimate_title(
    model_name: str, seq_len: int, where: str, device_kind: str, ceiling_bytes: int, ranks: int = 1
) -> str:
    """The title of ``autotune estimate``'s table: which memory is predicted, of what, where, under which ceiling;
    of a trial of several ranks, the largest rank's (as a trial records it, ``runner/_ranks.py``)."""
    memory = "peak RSS of the trial's process tree" if device_kind == "cpu" else "device memory as nvidia-smi shows it"
    if ranks > 1:
        memory = (
            f"{memory}, the largest of its {ranks} ranks"
            if device_kind == "cuda"
            else f"peak RSS of the largest of its {ranks} ranks, which share this machine's memory"
        )
    ceiling = f"ceiling {format_bytes(ceiling_bytes)}" + (" a rank" if ranks_sharing(device_kind, ranks) > 1 else "")
    return f"Predicted peak memory ({memory}) of {model_name}, seq len {seq_len}, on {where}, {ceiling}"


def show_estimate(
    console: Console, planned: Any, options: Any, fit: MemoryFit, speed: Any, screen_margin: float, default: TrialConfig
) -> None:
    """What ``autotune estimate`` prints for ``planned`` (its :class:`autotune.plan.Plan`) and ``options``
    (its ``EstimateOptions``): the rows predicted with ``fit`` and ``speed`` (the memory and throughput
    models, calibrated or not), as JSON (``--json``) or as tables; ``default``: the trainer's default config."""
    workload = planned.workload
    model, device, ceiling, seq_len = workload.model, workload.device, workload.ceiling_bytes, workload.seq_len
    # A GPU planned from its datasheet (--gpu-type) runs on a host that is not this one: its RAM is not known.
    host_ceiling = None if options.gpu_type else workload.host_ceiling_bytes
    rows = plan_rows(model, planned.space.choices, seq_len, fit, ceiling, speed, host_ceiling)
    advice = what_would_fit(model, planned.space.choices, seq_len, fit, ceiling, device)
    if options.gpu_type:
        where = f"{options.gpu_type} ({device.name}, datasheet)"
    else:
        where = f"{device.label} ({device.name})"
    run_time = predicted_run_time_of(planned, rows, speed, options, default, fit)
    if options.as_json:
        header = estimate_header(planned, where, fit, speed, advice, run_time)
        sys.stdout.write(estimate_json(rows, {**header, "host_ceiling_bytes": host_ceiling}) + "\n")
        return
    print_estimate(
        console,
        estimate_title(trained_name(model), seq_len, where, device.kind, ceiling, workload.devices_per_trial),
        rows,
        notes=planned.notes,
        advice=advice,
        fit=fit,
        speed=speed.fit,
        screen_margin=screen_margin,
        ceiling_bytes=ceiling,
        device_kind=device.kind,
        space_size=planned.space.size if options.all_rows else None,
        run_time=run_time,
        host_ceiling_bytes=host_ceiling,
    )


def estimate_header(
    planned: Any, where: str, fit: MemoryFit, speed: Any, advice: FitAdvice | None, run_time: str | None
) -> dict[str, Any]:
    """``estimate --json``'s header: what the rows were predicted for, by which estimators, and the run's
    predicted wall time (``None`` without a predicted winner)."""
    workload = planned.workload
    return {
        "model": workload.model.name,
        "peft": workload.model.peft.identity() if workload.model.peft is not None else None,
        "seq_len": workload.seq_len,
        "device": where,
        "device_kind": workload.device.kind,
        "device_memory_bytes": workload.device.total_memory_bytes,
        "ceiling_bytes": workload.ceiling_bytes,
        "estimator": fit.describe(),
        "speed_estimator": speed.fit.describe(),
        "speed_expected_error": speed_expected_error(speed.fit),
        "space_notes": list(planned.notes),
        "nothing_fits": advice.sentence() if advice else None,
        "run_time": run_time,
    }


def print_estimate(
    console: Console,
    title: str,
    rows: Sequence[EstimateRow],
    *,
    notes: Sequence[str],
    advice: FitAdvice | None,
    fit: MemoryFit,
    speed: SpeedFit | None = None,
    screen_margin: float,
    ceiling_bytes: int,
    device_kind: str,
    space_size: int | None,
    run_time: str | None = None,
    host_ceiling_bytes: int | None = None,
) -> None:
    """``autotune estimate``'s text: the plan's notes, the table (given the ``space_size``, every
    memory-distinct config by part; else per setting the largest micro-batch that fits; with the throughput
    prior's columns where ``speed`` is given), the predicted winner, what would fit where nothing does, what
    the host column means, the estimators."""
    for note in notes:
        console.print(f"[dim]note: {for_rich(note)}[/]")
    if space_size is not None:
        console.print(
            estimate_table(
                f"{title}: {len(rows)} memory-distinct configs of {space_size}",
                rows,
                ceiling_bytes,
                screen_margin,
                with_speed=speed is not None,
            )
        )
    else:
        console.print(estimate_short_table(title, by_setting(rows), ceiling_bytes, speed is not None))
    if speed is not None:
        console.print(winner_line(rows, speed))
    if run_time is not None:
        console.print(run_time, markup=False, highlight=False, soft_wrap=True)
    if advice is not None:
        console.print(what_would_fit_table(advice))
    if shows_host_memory([row.estimate for row in rows]):
        console.print(host_memory_note(device_kind, host_ceiling_bytes))
    console.print(f"estimator: {fit.describe()}")
    if speed is not None:
        console.print(f"speed estimator: {speed.describe()}")


def estimate_table(
    title: str, rows: Sequence[EstimateRow], ceiling_bytes: int, screen_margin: float, with_speed: bool = False
) -> Table:
    """Predicted peak memory per config, by part, against the ceiling (``autotune estimate``), and each
    config's predicted speed (``with_speed``)."""
    table = Table(
        title=title,
        caption=(
            "weights: the parameters in their dtype (fp32; 16-bit under weights=bf16; a 4-bit base under QLoRA) + "
            "16-bit autocast copies of fp32 weights under fp16/bf16; gradients: of what trains (every parameter, or "
            "the adapters under --peft), in its dtype; optimizer states: per optimizer; activations: Korthikanti et al. 2022 per layer, calibrated scale; logits: "
            "three fp32 b·s·V tensors of the LM loss; allocator: CUDA caching allocator's workspaces and "
            "fragmentation (0 on the CPU); context: CUDA context, or on the CPU the process baseline "
            f"(per dataloader worker too). fits: predicted peak <= ceiling; screened: > ceiling x {screen_margin:.2f}, "
            "a search would not run it." + (f" {SPEED_CAPTION}" if with_speed else "")
        ),
        caption_justify="left",
    )
    parts = list(rows[0].estimate.parts()) if rows else []
    host = shows_host_memory([row.estimate for row in rows])
    speed_headers = list(SPEED_COLUMNS) if with_speed else []
    headers = ["config", *parts, "predicted peak", *([HOST_COLUMN] if host else []), "vs ceiling", *speed_headers]
    for header in headers:
        table.add_column(header, justify="left" if header == "config" else "right")
    for row in rows:
        config, estimate, total = row.config, row.estimate, row.estimate.total_bytes
        if row.fits:
            verdict = "[green]fits[/]"
        elif fits(total, ceiling_bytes):
            verdict = "[magenta]host RAM over[/]"
        elif fits(total, ceiling_bytes * screen_margin):
            verdict = "[yellow]over (would run)[/]"
        else:
            verdict = "[magenta]screened[/]"
        host_cell = [format_bytes(estimate.host_bytes)] if host else []
        table.add_row(
            config.short(),
            *(format_bytes(v) for v in estimate.parts().values()),
            format_bytes(total),
            *host_cell,
            verdict,
            *(speed_cells(row.speed) if with_speed else []),
        )
    return table


def _cell(value: Any) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def estimate_short_table(
    title: str, settings: Sequence[SettingRow], ceiling_bytes: int, with_speed: bool = False
) -> Table:
    """``autotune estimate``'s default: per setting of the other memory levers, the largest micro-batch
    predicted to fit and its predicted peak (:func:`autotune.estimate.by_setting`).

    The levers with a ``planner_column`` get a column of their own; every other lever that moves
    memory and is away from its default is shown under "other levers" as the config's label says it
    (weights=bf16, zero=2, ...); the micro-batch (a lever whose memory grows with its value) is the
    one the table solves for. ``with_speed``: the throughput prior's columns too, for the setting's
    fastest micro-batch that fits (named: on samples that differ in length a padded batch is not fastest
    at its largest), the settings fastest first, so the first row holds the predicted winner.
    """
    table = Table(
        title=title,
        caption="largest micro-batch: of the space's micro-batches, the largest whose predicted peak is at most the "
        "ceiling; predicted peak: that config's (--all: every row by part; --json: every row for scripts)."
        + (
            " fastest micro-batch: of those that fit, the one predicted fastest, whose speed the next columns give. "
            f"{SPEED_CAPTION}"
            if with_speed
            else ""
        ),
        caption_justify="left",
    )
    host = shows_host_memory([setting.largest.estimate for setting in settings])
    columns = [lever for lever in LEVERS.values() if lever.planner_column]
    headers = (
        *(lever.planner_column for lever in columns),
        "other levers",
        "largest micro-batch",
        "predicted peak",
        *([HOST_COLUMN] if host else []),
        "vs ceiling",
        *(("fastest micro-batch", *SPEED_COLUMNS) if with_speed else ()),
    )
    right = ("largest micro-batch", "predicted peak", HOST_COLUMN, "fastest micro-batch", *SPEED_COLUMNS)
    for header in headers:
        table.add_column(header, justify="right" if header in right else "left")
    others = [lever for lever in LEVERS.values() if lever.memory_parts and not lever.planner_column]

    def size(config: TrialConfig) -> str:
        return " x ".join(str(getattr(config, lever.name)) for lever in others if lever.grows_memory)

    # The levers that change only the speed (torch.compile): each row is at the value the prior predicts fastest
    # (estimate._plan_table.fastest_variant), said beside the memory levers.
    speed_only = [lever for lever in LEVERS.values() if lever.speed is not None and not lever.memory_parts]

    for setting in settings:
        config = setting.largest.config
        shown = (setting.fastest or setting.largest).config
        label = " ".join(
            [
                lever.label(getattr(config, lever.name))
                for lever in others
                if not lever.grows_memory and getattr(config, lever.name) != lever.default
            ]
            + [
                lever.label(getattr(shown, lever.name))
                for lever in speed_only
                if lever.name not in GLOBAL_BATCH_LEVERS and getattr(shown, lever.name) != lever.default
            ]
        )
        over = setting.largest.estimate.total_bytes - ceiling_bytes
        verdict = (
            "[green]fits[/]"
            if setting.fits
            else ("[magenta]host RAM over[/]" if over <= 0 else f"[magenta]over by {format_bytes(over)}[/]")
        )
        fastest = setting.fastest
        speed = (
            [size(fastest.config), *speed_cells(fastest.speed)] if fastest is not None else ["-", *speed_cells(None)]
        )
        table.add_row(
            *(_cell(getattr(config, lever.name)) for lever in columns),
            label or "-",
            size(config) if setting.fits else f"none (smallest {size(config)})",
            format_bytes(setting.largest.estimate.total_bytes),
            *([format_bytes(setting.largest.estimate.host_bytes)] if host else []),
            verdict,
            *(speed if with_speed else []),
        )
    return table


def what_would_fit_table(advice: FitAdvice) -> Table:
    """``autotune estimate`` when no config of the space fits: the smallest config with one lever
    changed at a time, predicted (:func:`autotune.estimate.what_would_fit`, the search's answer too)."""
    smallest = advice.smallest
    table = Table(
        title=f"Nothing in the space fits: the smallest predicted peak is {format_bytes(smallest.estimate.total_bytes)} "
        f"({smallest.config.short()}); one lever changed at a time",
        caption=advice.advice(),
        caption_justify="left",
    )
    for header in ("lever", "value", "predicted peak", "vs ceiling"):
        table.add_column(header, justify="right" if header == "predicted peak" else "left")

    def verdict(total: int) -> str:
        return (
            "[green]fits[/]"
            if fits(total, advice.ceiling_bytes)
            else f"[magenta]over by {format_bytes(total - advice.ceiling_bytes)}[/]"
        )

    for change in advice.changes:
        value = str(change.value).lower() if isinstance(change.value, bool) else str(change.value)
        table.add_row(
            change.lever, value, format_bytes(change.estimate.total_bytes), verdict(change.estimate.total_bytes)
        )
    leanest = advice.leanest
    if advice.changes:
        table.add_row(
            "all of them",
            leanest.config.short(),
            format_bytes(leanest.estimate.total_bytes),
            verdict(leanest.estimate.total_bytes),
        )
    return table
