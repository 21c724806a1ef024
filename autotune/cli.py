"""The ``autotune`` command line: parse, call, print. All the work happens in the modules it calls."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer
from rich.console import Console

from autotune.errors import AutotuneError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Find the fastest way to train a Hugging Face Transformers model on your GPU without running out of memory.",
)
console = Console()
err_console = Console(stderr=True)

StorageOption = Annotated[str, typer.Option(help="Optuna storage URL (sqlite:///file.db or postgresql://...).")]
StudyOption = Annotated[Optional[str], typer.Option(help="Study name (default: the only study in the storage).")]


@app.command()
def search(
    model: Annotated[str, typer.Option(help="Local model directory, Hugging Face id, or catalog name.")],
    gpu: Annotated[Optional[int], typer.Option(help="CUDA device number.")] = None,
    device: Annotated[Optional[str], typer.Option(help="cpu, cuda or cuda:N (default cpu unless --gpu).")] = None,
    seq_len: Annotated[int, typer.Option(help="Tokens per training sample.")] = 128,
    memory_ceiling: Annotated[str, typer.Option(help="Fraction of device memory (0.9) or a size (14GiB).")] = "0.9",
    space: Annotated[Optional[str], typer.Option(help="Search space YAML (default: search_spaces/default.yaml).")] = None,
    storage: StorageOption = "sqlite:///autotune.db",
    study_name: Annotated[Optional[str], typer.Option(help="Default: <model>-<device>-s<seq-len>.")] = None,
    trials: Annotated[int, typer.Option(help="Trials to run in this invocation.")] = 20,
    timeout: Annotated[Optional[float], typer.Option(help="Stop starting trials after this many seconds.")] = None,
    trial_timeout: Annotated[float, typer.Option(help="Kill a trial after this many seconds.")] = 900.0,
    task: Annotated[Optional[str], typer.Option(help="sequence-classification, causal-lm or masked-lm.")] = None,
    warmup_steps: Annotated[int, typer.Option(help="Optimizer steps excluded from timing.")] = 3,
    max_measure_steps: Annotated[int, typer.Option(help="Measured optimizer steps at most, per trial.")] = 40,
    work_dir: Annotated[str, typer.Option(help="Where trials keep their logs.")] = "autotune_runs",
) -> None:
    """Run (or resume) a study: every candidate trains for real in its own process."""
    import psutil

    from autotune.devices import child_address_space_budget, resolve_device
    from autotune.display import SearchView
    from autotune.measure import MeasureSettings
    from autotune.models import resolve_model
    from autotune.space import load_space
    from autotune.study import SearchProgress, SearchRequest, default_study_name, open_storage, open_study, redact, run_search
    from autotune.units import format_bytes, parse_ceiling

    if seq_len <= 0 or trials <= 0:
        raise AutotuneError("--seq-len and --trials must be positive")
    device_spec = resolve_device(device, gpu)
    ceiling = parse_ceiling(memory_ceiling, device_spec.total_memory_bytes)
    model_spec = resolve_model(model, task)
    if model_spec.max_positions and seq_len > model_spec.max_positions:
        raise AutotuneError(f"--seq-len {seq_len} is longer than {model} allows ({model_spec.max_positions} positions)")
    search_space = load_space(space, device_spec)
    for note in search_space.notes:
        console.print(f"[dim]note: {note}[/]")
    request = SearchRequest(
        model=model_spec,
        device=device_spec,
        seq_len=seq_len,
        ceiling_bytes=ceiling,
        space=search_space,
        measure=MeasureSettings(warmup_steps=warmup_steps, max_steps=max_measure_steps),
        trial_timeout_s=trial_timeout,
        work_root=work_dir,
        address_space_bytes=(
            child_address_space_budget(ceiling, psutil.virtual_memory().available) if device_spec.kind == "cpu" else None
        ),
    )
    name = study_name or default_study_name(model, device_spec, seq_len)
    study = open_study(open_storage(storage), name, request)
    from autotune.study import recover_orphans

    recovered = recover_orphans(study)
    if recovered:
        console.print(f"note: trial(s) {', '.join(map(str, recovered))} were left running by a run that died; queued again")
    probe_source = "peak RSS of the trial's process tree" if device_spec.kind == "cpu" else "peak reserved + outside-allocator device memory"
    console.print(
        f"study [bold]{name}[/] in {redact(storage)}: {model_spec.name} ({model_spec.num_params / 1e6:.1f} M params, "
        f"{model_spec.task}) on {device_spec.label} ({device_spec.name}), seq len {seq_len}, "
        f"ceiling {format_bytes(ceiling)}, space of {search_space.size} configs, {len(study.trials)} trials so far"
    )
    view = SearchView(console, trials, ceiling, probe_source)
    try:
        with view:
            run_search(study, request, trials, timeout, SearchProgress(view.trial_started, view.trial_finished))
    except KeyboardInterrupt:
        err_console.print(
            f"interrupted: the running trial was stopped and recorded as interrupted; {len(study.trials)} trials are in "
            f"study {name!r}. Run the same command again to resume."
        )
        raise typer.Exit(130) from None
    _print_ranking(study, top=5)


@app.command()
def best(
    storage: StorageOption = "sqlite:///autotune.db",
    study_name: StudyOption = None,
    all: Annotated[bool, typer.Option("--all", help="Every trial, failures included, in trial order.")] = False,
    top: Annotated[int, typer.Option(help="Rows to show.")] = 20,
) -> None:
    """Print the ranked feasible configurations of a study (or every trial with --all)."""
    from autotune.ranking import all_trials
    from autotune.study import load_study

    study = load_study(storage, study_name)
    if all:
        from autotune.display import trial_table

        console.print(trial_table(f"All trials of {study.study_name}", all_trials(study.get_trials(deepcopy=False))))
        return
    _print_ranking(study, top)


def _print_ranking(study, top: int) -> None:  # noqa: ANN001 - an optuna.Study
    from autotune.display import trial_table
    from autotune.ranking import feasible_ranking

    ranking = feasible_ranking(study.get_trials(deepcopy=False))
    if not ranking:
        console.print(f"study {study.study_name!r}: no feasible trial yet (see `autotune best --all`)")
        return
    source = ranking[0].result.memory_source if ranking[0].result else ""
    console.print(trial_table(f"Feasible configurations of {study.study_name}, fastest first", ranking[:top], source))


@app.command()
def export(
    out: Annotated[str, typer.Option(help="File to write.")] = "best_args.json",
    storage: StorageOption = "sqlite:///autotune.db",
    study_name: StudyOption = None,
) -> None:
    """Write the winner's TrainingArguments as JSON: TrainingArguments(output_dir=..., **json.load(f))."""
    from autotune.export import winner, winner_arguments, write_json
    from autotune.study import load_study

    study = load_study(storage, study_name)
    arguments = winner_arguments(study)
    write_json(arguments, out)
    best_trial = winner(study)
    console.print(f"wrote {out}: trial #{best_trial.number}, {best_trial.samples_per_s:.1f} samples/s ({best_trial.config.short()})")


@app.command()
def devices() -> None:
    """List the devices autotune can use, with their datasheet peaks."""
    from rich.table import Table

    from autotune.config import DTYPES
    from autotune.devices import cpu_device, cuda_device
    from autotune.units import format_bytes

    found = [cpu_device()]
    index = 0
    while True:
        try:
            found.append(cuda_device(index))
        except AutotuneError:
            break
        index += 1
    table = Table(title="Devices (peaks: dense datasheet TFLOPS per dtype; '-' = unknown, never invented)")
    for header in ["device", "name", "memory", *[f"{d} peak" for d in DTYPES]]:
        table.add_column(header)
    for spec in found:
        peaks = [_fmt_peak(spec.datasheet_peak_tflops(d)) if d in spec.supported_dtypes else "n/a" for d in DTYPES]
        table.add_row(spec.label, spec.name, format_bytes(spec.total_memory_bytes), *peaks)
    console.print(table)


def _fmt_peak(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def main() -> None:
    """Console entry point: user errors become one line on stderr and exit status 2."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        app()
    except AutotuneError as exc:
        err_console.print(f"autotune: error: {exc}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
