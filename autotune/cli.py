"""The ``autotune`` command line: parse, call, print. All the work happens in the modules it calls."""

from __future__ import annotations

import os
import signal
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


def _console(stderr: bool = False) -> Console:
    # Piped into a log or CI, Rich would wrap at its 80-column default and cut the trial table's
    # configs into slivers; a wider page keeps rows readable. COLUMNS, when set, still wins.
    stream = sys.stderr if stderr else sys.stdout
    piped = not stream.isatty() and "COLUMNS" not in os.environ
    return Console(stderr=stderr, width=140 if piped else None)


console = _console()
err_console = _console(stderr=True)

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
    gpus: Annotated[Optional[str], typer.Option(help="CUDA devices to use at once, e.g. 0,1,2,3: one trial per GPU.")] = None,
    workers: Annotated[int, typer.Option(help="CPU only: trials to run at once (they share the cores).")] = 1,
    max_total_trials: Annotated[
        Optional[int], typer.Option(help="Study-wide cap over all workers and machines: complete + running trials.")
    ] = None,
    confirm_top: Annotated[
        int, typer.Option(help="At the end, re-measure this many leading configs interleaved (0: skip).")
    ] = 3,
    confirm_repeats: Annotated[int, typer.Option(help="Re-runs of each config when confirming.")] = 3,
    callback: Annotated[
        Optional[list[str]],
        typer.Option(hidden=True, help="module:Class of an extra TrainerCallback for every trial (repeatable); fault injection, probes."),
    ] = None,
    dataset: Annotated[
        Optional[str], typer.Option(help="Your data: a datasets.save_to_disk directory, or JSONL/text files (default: synthetic tokens).")
    ] = None,
    text_column: Annotated[Optional[str], typer.Option(help="The --dataset column to train on (default: found).")] = None,
    packing: Annotated[bool, typer.Option(help="Pack --dataset documents into full --seq-len blocks instead of padding.")] = False,
    base_args: Annotated[
        Optional[str], typer.Option(help="JSON of TrainingArguments you fix (learning_rate, ...): kept in every trial and the export.")
    ] = None,
    global_batch: Annotated[
        Optional[int], typer.Option(help="Search only micro-batch x accumulation = this (per device); the export keeps it.")
    ] = None,
    max_global_batch: Annotated[Optional[int], typer.Option(help="Search only micro-batch x accumulation <= this.")] = None,
    prune_ratio: Annotated[
        float, typer.Option(help="Stop a trial measured below this fraction of the best feasible samples/s (0: never).")
    ] = 0.5,
    screen: Annotated[
        bool, typer.Option("--screen/--no-screen", help="Skip configs the memory estimate or a measured OOM says cannot fit.")
    ] = True,
) -> None:
    """Run (or resume) a study: every candidate trains for real in its own process."""
    import psutil

    from autotune.devices import child_address_space_budget
    from autotune.display import SearchView
    from autotune.measure import MeasureSettings
    from autotune.models import resolve_model
    from autotune.space import load_space
    from autotune.study import SearchProgress, SearchRequest, default_study_name, open_storage, open_study, redact
    from autotune.units import format_bytes, parse_ceiling
    from autotune.workers import run_workers, worker_devices

    if seq_len <= 0 or trials <= 0 or (max_total_trials is not None and max_total_trials <= 0):
        raise AutotuneError("--seq-len, --trials and --max-total-trials must be positive")
    if confirm_top < 0 or (confirm_top > 0 and confirm_repeats < 2):
        raise AutotuneError("--confirm-top must be 0 (skip) or more, and --confirm-repeats at least 2")
    if not 0 <= prune_ratio < 1:
        raise AutotuneError(f"--prune-ratio {prune_ratio}: give a fraction from 0 (never prune) up to, not including, 1")
    devices_of_workers = worker_devices(device, gpu, gpus, workers)
    device_spec = devices_of_workers[0]
    ceiling = parse_ceiling(memory_ceiling, device_spec.total_memory_bytes)
    model_spec = resolve_model(model, task)
    if model_spec.max_positions and seq_len > model_spec.max_positions:
        raise AutotuneError(f"--seq-len {seq_len} is longer than {model} allows ({model_spec.max_positions} positions)")
    from autotune.config import load_base_args

    fixed_args = load_base_args(base_args) if base_args else {}
    search_space = load_space(
        space, device_spec, model=model_spec, base_args=fixed_args, global_batch=global_batch, max_global_batch=max_global_batch,
        real_data=dataset is not None, packing=packing,
    )
    from autotune.runner import load_callback

    for callback_name in callback or ():
        load_callback(callback_name)  # a wrong name fails here, once, not in every trial
    for note in search_space.notes:
        console.print(f"[dim]note: {note}[/]")
    data = None
    if dataset is not None:
        from autotune.data import prepare_dataset

        data = prepare_dataset(
            dataset, model_spec, seq_len, search_space.largest_global_batch, warmup_steps + max_measure_steps,
            os.path.join(work_dir, "datasets"), text_column, packing,
        )
        console.print(f"dataset {data['label']}: {data['num_samples']} samples")
    from autotune.calibrate import load_measured_peaks, peak_note

    measured_peaks = load_measured_peaks(device_spec.name)
    console.print(f"[dim]note: {peak_note(device_spec, measured_peaks)}[/]")
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
            child_address_space_budget(ceiling, psutil.virtual_memory().available // len(devices_of_workers))
            if device_spec.kind == "cpu"
            else None
        ),
        measured_peaks_tflops=measured_peaks,
        callbacks=tuple(callback or ()),
        base_args=fixed_args,
        dataset=data,
        screen=screen,
        prune_ratio=prune_ratio,
    )
    name = study_name or default_study_name(model, device_spec, seq_len)
    study = open_study(open_storage(storage), name, request)
    if all(t.state.name == "WAITING" for t in study.trials):  # a new study: say how its seeds were fitted
        for note in study.user_attrs.get("seed_notes", []):
            console.print(f"[dim]note: {note}[/]")
    from autotune.study import recover_orphans

    recovered = recover_orphans(study)
    if recovered:
        console.print(f"note: trial(s) {', '.join(map(str, recovered))} were left running by a run that died; queued again")
    probe_source = "peak RSS of the trial's process tree" if device_spec.kind == "cpu" else "peak reserved + outside-allocator device memory"
    console.print(
        f"study [bold]{name}[/] in {redact(storage)}: {model_spec.name} ({model_spec.num_params / 1e6:.1f} M params, "
        f"{model_spec.task}) on {', '.join(d.label for d in devices_of_workers)} ({device_spec.name}), seq len {seq_len}, "
        f"ceiling {format_bytes(ceiling)}, space of {search_space.size} configs, {len(study.trials)} trials so far"
    )
    view = SearchView(console, trials, ceiling, probe_source)
    # `kill`, `docker stop`, a batch scheduler: stop as on Ctrl-C, so the running trial is recorded.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with view:
            run_workers(
                study, request, devices_of_workers, trials, timeout,
                SearchProgress(view.trial_started, view.trial_finished), max_total_trials,
            )
    except KeyboardInterrupt:
        from autotune.study import describe_standing

        err_console.print(
            f"interrupted: running trials were stopped, recorded as interrupted and queued to run again. "
            f"{describe_standing(study)}. To resume, run the same command again.",
            markup=False, highlight=False, soft_wrap=True,
        )
        raise typer.Exit(130) from None
    if confirm_top > 0:
        _confirm(study, request, confirm_top, confirm_repeats)
    from autotune.dashboard import save_study_note

    save_study_note(study)  # the dashboard's study note: ranked top configs, the winner's export
    _print_ranking(study, top=5)
    _print_speedup(study)


def _print_speedup(study) -> None:  # noqa: ANN001 - an optuna.Study
    from autotune.ranking import confirmations_of
    from autotune.seeds import speedup_over_default

    speedup = speedup_over_default(study.get_trials(deepcopy=False), confirmations_of(study))
    if speedup is None:
        return
    best = f"#{speedup.best_trial} {speedup.best_config.short()} at {speedup.best_samples_per_s:.1f} samples/s"
    default = f"HF default TrainingArguments (#{speedup.default_trial})"
    if speedup.ratio is None:
        console.print(f"speedup over HF default: n/a: {default} did not fit ({speedup.default_status}); winner {best}")
        return
    console.print(
        f"speedup over HF default: [bold]{speedup.ratio:.2f}x[/] (winner {best}; {default} at "
        f"{speedup.default_samples_per_s:.1f} samples/s; steady-state medians, same ceiling)"
    )


def _confirm(study, request, top_k: int, repeats: int) -> None:  # noqa: ANN001 - optuna.Study, SearchRequest
    from autotune.confirm import confirm_top

    console.print(f"confirming: re-running the top {top_k} feasible configs {repeats} times each, interleaved")

    def on_run(round_index: int, number: int, result) -> None:  # noqa: ANN001 - a TrialResult
        figure = f"{result.samples_per_s:.1f} samples/s" if result.samples_per_s else result.error[:60]
        console.print(f"  round {round_index + 1}/{repeats}: #{number} {result.status}, {figure}")

    try:
        confirm_top(study, request, top_k, repeats, on_run)
    except KeyboardInterrupt:
        err_console.print("confirmation interrupted: the ranking below rests on single search measurements")


@app.command()
def estimate(
    model: Annotated[str, typer.Option(help="Local model directory, Hugging Face id, or catalog name.")],
    seq_len: Annotated[int, typer.Option(help="Tokens per training sample.")] = 128,
    gpu: Annotated[Optional[int], typer.Option(help="CUDA device number.")] = None,
    device: Annotated[Optional[str], typer.Option(help="cpu, cuda or cuda:N (default cpu unless --gpu).")] = None,
    space: Annotated[Optional[str], typer.Option(help="Search space YAML (default: search_spaces/default.yaml).")] = None,
    memory_ceiling: Annotated[str, typer.Option(help="Fraction of device memory (0.9) or a size (14GiB).")] = "0.9",
    task: Annotated[Optional[str], typer.Option(help="sequence-classification, causal-lm or masked-lm.")] = None,
    storage: Annotated[
        Optional[str], typer.Option(help="Calibrate on the measured trials of a study in this storage.")
    ] = None,
    study_name: StudyOption = None,
) -> None:
    """Predict each config's peak memory, by part, without running anything."""
    from autotune.devices import resolve_device
    from autotune.display import estimate_table
    from autotune.estimate import Calibration, estimate_peak, memory_distinct_configs
    from autotune.models import resolve_model
    from autotune.screening import calibration_from_trials, margin_for
    from autotune.space import load_space
    from autotune.units import format_bytes, parse_ceiling

    if seq_len <= 0:
        raise AutotuneError("--seq-len must be positive")
    device_spec = resolve_device(device, gpu)
    ceiling = parse_ceiling(memory_ceiling, device_spec.total_memory_bytes)
    model_spec = resolve_model(model, task)
    search_space = load_space(space, device_spec, model=model_spec)
    calibration = Calibration.prior(device_spec.kind)
    if storage is not None:
        from autotune.study import load_study, measured_trials

        study = load_study(storage, study_name)
        identity = study.user_attrs.get("identity") or {}
        if (identity.get("model"), identity.get("seq_len"), identity.get("device")) != (model, seq_len, device_spec.name):
            raise AutotuneError(
                f"study {study.study_name!r} measured {identity.get('model')} at seq len {identity.get('seq_len')} on "
                f"{identity.get('device')}: calibrate with a study of the same model, length and device"
            )
        calibration = calibration_from_trials(model_spec, seq_len, device_spec.kind, measured_trials(study))
    configs = memory_distinct_configs(search_space.choices, device_spec.kind)
    rows = [(c, estimate_peak(model_spec, c, seq_len, device_spec.kind, calibration)) for c in configs]
    memory = "peak RSS of the trial's process tree" if device_spec.kind == "cpu" else "device memory"
    console.print(
        estimate_table(
            f"Predicted peak memory ({memory}) of {model_spec.name}, seq len {seq_len}, on {device_spec.label}: "
            f"{len(configs)} memory-distinct configs of {search_space.size}, ceiling {format_bytes(ceiling)}",
            rows, ceiling, margin_for(calibration),
        )
    )
    console.print(f"estimator: {calibration.describe()}")


@app.command()
def best(
    storage: StorageOption = "sqlite:///autotune.db",
    study_name: StudyOption = None,
    all: Annotated[bool, typer.Option("--all", help="Every trial, failures included, in trial order.")] = False,
    top: Annotated[int, typer.Option(help="Rows to show.")] = 20,
) -> None:
    """Print the ranked feasible configurations of a study (or every trial with --all)."""
    from autotune.ranking import all_trials, confirmations_of
    from autotune.study import load_study

    study = load_study(storage, study_name)
    if all:
        from autotune.display import trial_table

        rows = all_trials(study.get_trials(deepcopy=False), confirmations_of(study))
        console.print(trial_table(f"All trials of {study.study_name}", rows))
        return
    _print_ranking(study, top)


def _print_ranking(study, top: int) -> None:  # noqa: ANN001 - an optuna.Study
    from autotune.confirm import describe_winner
    from autotune.display import trial_table
    from autotune.ranking import study_ranking

    ranking = study_ranking(study)
    if not ranking:
        console.print(f"study {study.study_name!r}: no feasible trial yet (see `autotune best --all`)")
        return
    source = ranking[0].result.memory_source if ranking[0].result else ""
    console.print(trial_table(f"Feasible configurations of {study.study_name}, fastest first", ranking[:top], source))
    console.print(describe_winner(ranking))


@app.command()
def export(
    out: Annotated[
        Optional[str], typer.Option(help="File to write ('-': standard output). Default: best_args.json/.txt/.py, accelerate_config.yaml.")
    ] = None,
    fmt: Annotated[
        str, typer.Option("--format", help="json (TrainingArguments(**json.load(f))), cli (HF example script flags), python, accelerate.")
    ] = "json",
    storage: StorageOption = "sqlite:///autotune.db",
    study_name: StudyOption = None,
) -> None:
    """Write the winner's TrainingArguments: JSON, script flags, a Python snippet or an accelerate config."""
    from autotune.export import DEFAULT_OUT, FORMATS, export_winner, model_loading_note
    from autotune.study import load_study

    if fmt not in FORMATS:
        raise AutotuneError(f"--format {fmt!r} is not known: choose one of {', '.join(FORMATS)}")
    out = out or DEFAULT_OUT[fmt]
    study = load_study(storage, study_name)
    best_trial = export_winner(study, fmt, out)
    if out != "-":
        console.print(
            f"wrote {out} ({fmt}): trial #{best_trial.number}, {best_trial.samples_per_s:.1f} samples/s ({best_trial.config.short()})"
        )
    note = model_loading_note(best_trial)
    if note is not None:
        err_console.print(f"note: {note}")  # stderr: `--out -` keeps stdout to the export itself


@app.command()
def dashboard(
    storage: StorageOption = "sqlite:///autotune.db",
    host: Annotated[str, typer.Option(help="Address to listen on. The dashboard has no login: keep it on loopback.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = 8080,
) -> None:
    """Serve optuna-dashboard on the study storage: OOM and over-ceiling trials shown infeasible, a note per study."""
    from autotune.dashboard import is_loopback, serve
    from autotune.study import redact

    if not is_loopback(host):
        err_console.print(
            f"warning: listening on {host}: the dashboard has no login, and anyone who reaches it can read, edit and delete studies"
        )

    def listening(url: str) -> None:
        console.print(f"optuna-dashboard on {redact(storage)}: {url} (Ctrl-C to stop)", soft_wrap=True)
        sys.stdout.flush()

    serve(storage, host, port, listening)


@app.command()
def report(
    out: Annotated[str, typer.Option(help="HTML file to write (self-contained: opens offline).")] = "report.html",
    storage: StorageOption = "sqlite:///autotune.db",
    study_name: StudyOption = None,
) -> None:
    """Write one self-contained HTML page of plotly figures: speed vs memory, history, knob effects, timeline, ranking."""
    from autotune.report import write_report
    from autotune.study import load_study

    study = load_study(storage, study_name)
    write_report(study, out)
    console.print(f"wrote {out}: report of study {study.study_name!r} ({len(study.trials)} trials)")


@app.command()
def devices(
    calibrate: Annotated[
        bool, typer.Option("--calibrate", help="Measure the achievable matmul TFLOPS per dtype and store it.")
    ] = False,
    device: Annotated[Optional[str], typer.Option(help="With --calibrate: only this device (cpu, cuda:N).")] = None,
    seconds: Annotated[float, typer.Option(help="With --calibrate: seconds of timed matmuls per dtype.")] = 1.0,
    matrix_size: Annotated[
        Optional[int], typer.Option(help="With --calibrate: n of the n x n matmuls (default 2048 on CPU, 8192 on GPU).")
    ] = None,
) -> None:
    """List the devices autotune can use with their peaks; --calibrate measures achievable peaks."""
    from rich.table import Table

    from autotune.calibrate import calibrate_device, load_measured_peaks, peak_note, save_calibration
    from autotune.config import DTYPES
    from autotune.devices import list_devices, resolve_device
    from autotune.display import format_tflops
    from autotune.units import format_bytes

    if seconds <= 0 or (matrix_size is not None and matrix_size <= 0):
        raise AutotuneError("--seconds and --matrix-size must be positive")
    found = list_devices()
    if calibrate:
        targets = [resolve_device(device, None)] if device is not None else found
        for spec in targets:
            console.print(f"calibrating {spec.label} ({spec.name}): timing matmuls in {', '.join(spec.supported_dtypes)}")
            peaks = calibrate_device(spec, matrix_size=matrix_size, seconds=seconds)
            path = save_calibration(spec, peaks)
            for peak in peaks:
                console.print(
                    f"  measured peak {spec.label} {peak.dtype}: {format_tflops(peak.tflops)} TFLOPS (best of "
                    f"{peak.iterations} {peak.matrix_size}x{peak.matrix_size} matmuls; median {format_tflops(peak.median_tflops)})"
                )
            console.print(f"  stored in {path}")
    table = Table(
        title="Devices: peak TFLOPS per dtype, datasheet / measured* ('-' = unknown, never invented; n/a = unsupported)"
    )
    for header in ["device", "name", "memory", "datasheet", *DTYPES]:
        table.add_column(header)
    notes = []
    for spec in found:
        measured = load_measured_peaks(spec.name)
        cells = []
        for dtype in DTYPES:
            if dtype not in spec.supported_dtypes:
                cells.append("n/a")
                continue
            datasheet = spec.datasheet_peak_tflops(dtype)
            cells.append(
                f"{'-' if datasheet is None else format_tflops(datasheet)} / "
                f"{format_tflops(measured[dtype]) + '*' if dtype in measured else '-'}"
            )
        entry = spec.datasheet_entry()
        table.add_row(spec.label, spec.name, format_bytes(spec.total_memory_bytes), entry.label if entry else "-", *cells)
        notes.append(f"{spec.label}: {peak_note(spec, measured)}")
    console.print(table)
    for note in notes:
        console.print(f"note: {note}")


def main() -> None:
    """Console entry point: user errors become one line on stderr and exit status 2."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        app()
    except AutotuneError as exc:
        err_console.print(f"autotune: error: {exc}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
