"""The ``autotune`` command line: each command checks its options, makes one call, prints. All the work happens in
the modules it calls (docs/architecture.md is the map); ``autotune.__main__`` runs the command and turns every user
error into one line. Each option is declared once, with its help text, in ``autotune.plan.cli_options``; its default
stays with its command."""

from __future__ import annotations

import contextlib
import os
import sys

import typer
from rich.console import Console

from autotune.plan import EstimateOptions, SearchOptions, VerifyOptions
from autotune.plan import cli_options as option
from autotune.storage import DEFAULT_STORAGE

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Find the fastest way to train a Hugging Face Transformers model on your GPU without running out of memory.",
)


def _console(stderr: bool = False) -> Console:
    # Piped (a log, CI), Rich would wrap at 80 columns and cut the trial table into slivers; COLUMNS still wins.
    stream = sys.stderr if stderr else sys.stdout
    piped = not stream.isatty() and "COLUMNS" not in os.environ
    return Console(stderr=stderr, width=140 if piped else None)


console, err_console = _console(), _console(stderr=True)


@app.command()
def search(
    model: option.Model,
    gpu: option.Gpu = None,
    device: option.Device = None,
    seq_len: option.SeqLen = SearchOptions.seq_len,
    memory_ceiling: option.Ceiling = SearchOptions.memory_ceiling,
    host_memory_ceiling: option.HostCeiling = None,
    space: option.Space = None,
    storage: option.Storage = DEFAULT_STORAGE,
    study_name: option.NewStudy = None,
    trials: option.Trials = SearchOptions.trials,
    timeout: option.Timeout = None,
    trial_timeout: option.TrialTimeout = SearchOptions.trial_timeout,
    compile_timeout: option.CompileTimeout = SearchOptions.compile_timeout,
    task: option.Task = None,
    warmup_steps: option.WarmupSteps = SearchOptions.warmup_steps,
    max_measure_steps: option.MaxMeasureSteps = SearchOptions.max_measure_steps,
    work_dir: option.WorkDir = SearchOptions.work_dir,
    gpus: option.Gpus = None,
    workers: option.Workers = SearchOptions.workers,
    devices_per_trial: option.DevicesPerTrial = SearchOptions.devices_per_trial,
    max_total_trials: option.MaxTotalTrials = None,
    confirm_top: option.ConfirmTop = SearchOptions.confirm_top,
    confirm_repeats: option.ConfirmRepeats = SearchOptions.confirm_repeats,
    confirm_budget: option.ConfirmBudget = SearchOptions.confirm_budget,
    callbacks: option.Callbacks = None,
    dataset: option.Dataset = None,
    text_column: option.TextColumn = None,
    packing: option.Packing = SearchOptions.packing,
    trainer: option.Trainer = None,
    loss_on: option.LossOn = None,
    base_args: option.BaseArgs = None,
    peft: option.Peft = None,
    global_batch: option.GlobalBatch = None,
    max_global_batch: option.MaxGlobalBatch = None,
    prune_ratio: option.PruneRatio = SearchOptions.prune_ratio,
    screen: option.Screen = SearchOptions.screen,
    patience: option.Patience = None,
    epochs: option.Epochs = None,
    price_per_hour: option.PricePerHour = None,
) -> None:
    """Run (or resume) a study: every candidate trains for real in its own process."""
    # Every parameter but --storage and --study-name is a search option, by the same name.
    options = SearchOptions.from_command(locals())
    options.check()  # before the heavy imports: a wrong option is answered at once
    import psutil

    from autotune.storage import open_storage, redact
    from autotune.study import (
        SearchHooks,
        SearchProgress,
        default_study_name,
        open_study,
        prepare_request,
        stop_as_on_ctrl_c,
    )
    from autotune.study import search as run_study
    from autotune.views.dashboard import save_study_note
    from autotune.views.search_display import SearchPrinter

    printer = SearchPrinter(console, err_console, options.trials, confirm_top, confirm_repeats, confirm_budget)
    prepared = prepare_request(options, psutil.virtual_memory().available)
    printer.prepared(prepared.notes, prepared.request.workload.dataset)
    name = study_name or default_study_name(model, prepared.request.workload.device, seq_len)
    study = open_study(open_storage(storage), name, prepared.request)
    view = printer.study_opened(study, redact(storage), prepared.request)
    hooks = SearchHooks(
        SearchProgress(view.trial_started, view.trial_finished),
        view,
        printer.note,
        printer.loop_ended,
        printer.confirm_run,
        write_note=save_study_note,  # the dashboard's study note: ranked top configs, the winner's export
    )
    received = stop_as_on_ctrl_c()
    try:
        outcome = run_study(study, prepared.request, prepared.budget, hooks)
    except KeyboardInterrupt:
        with contextlib.suppress(OSError):  # a terminal that hung up takes no more lines: the study has it all
            printer.interrupted()
        raise typer.Exit(128 + received[-1]) from None
    if outcome.confirmation_interrupted:
        printer.confirmation_interrupted()
    printer.results()
    if outcome.confirmation_interrupted:
        raise typer.Exit(128 + received[-1])  # the search's trials are recorded; the confirmation was cut short


@app.command()
def estimate(
    model: option.Model,
    seq_len: option.SeqLen = EstimateOptions.seq_len,
    gpu: option.Gpu = None,
    device: option.Device = None,
    gpu_type: option.GpuType = None,
    space: option.Space = None,
    memory_ceiling: option.Ceiling = EstimateOptions.memory_ceiling,
    task: option.Task = None,
    storage: option.CalibrationStorage = None,
    study_name: option.Study = None,
    all_rows: option.AllConfigs = False,
    as_json: option.Json = False,
    devices_per_trial: option.EstimateDevicesPerTrial = EstimateOptions.devices_per_trial,
    peft: option.EstimatePeft = None,
    dataset: option.Dataset = None,
    text_column: option.TextColumn = None,
    trainer: option.Trainer = None,
    base_args: option.BaseArgs = None,
    global_batch: option.GlobalBatch = None,
    max_global_batch: option.MaxGlobalBatch = None,
    epochs: option.Epochs = None,
    price_per_hour: option.PricePerHour = None,
) -> None:
    """Predict peak memory and speed without running anything: per dtype x checkpointing x optimizer, the
    largest and the fastest micro-batch that fit, the winner, the run's time (--all, --json: every config)."""
    # Every parameter is an estimate option, by the same name.
    options = EstimateOptions(**locals())
    options.check()  # before the heavy imports: a wrong option is answered at once
    from autotune.plan import plan
    from autotune.study import calibration_study, default_config, margin_for, memory_fit_of_study, speed_model_of_study
    from autotune.views.plan_display import show_estimate

    planned = plan(options)  # the search's plan: the same model, adapters, prior and space
    fit, speed = planned.prior, planned.workload.speed_model()
    if storage is not None:
        study = calibration_study(storage, study_name, planned.workload)
        fit = memory_fit_of_study(study, planned.workload.model, seq_len, fit)
        speed = speed_model_of_study(study, planned.workload.model, seq_len, speed)
    show_estimate(console, planned, options, fit, speed, margin_for(fit), default_config(planned.workload.trainer))


@app.command()
def best(
    storage: option.Storage = DEFAULT_STORAGE,
    study_name: option.Study = None,
    all: option.AllTrials = False,
    top: option.Top = 20,
    epochs: option.Epochs = None,
    price_per_hour: option.PricePerHour = None,
) -> None:
    """Print the ranked feasible configurations of a study (or every trial with --all)."""
    from autotune.plan import run_options, within

    within("--top", top)
    run_options(epochs, price_per_hour)
    from autotune.storage import load_study
    from autotune.views.search_display import print_all_trials, print_ranking

    study = load_study(storage, study_name)
    if all:
        print_all_trials(console, study)
    else:
        print_ranking(console, study, top, epochs, price_per_hour)


@app.command()
def export(
    out: option.ExportOut = None,
    fmt: option.ExportFormat = "json",
    storage: option.Storage = DEFAULT_STORAGE,
    study_name: option.Study = None,
    force: option.Force = False,
    epochs: option.Epochs = None,
    price_per_hour: option.PricePerHour = None,
) -> None:
    """Write the winner's TrainingArguments: JSON, script flags, a Python snippet or an accelerate config."""
    from autotune.plan import run_options
    from autotune.spec.files import Destination
    from autotune.storage import load_study, storage_files
    from autotune.views.export import export_notes, export_out, export_winner, exported_as
    from autotune.views.run_time import study_run_time
    from autotune.views.text import for_rich

    run_options(epochs, price_per_hour)
    out = export_out(fmt, out)
    destination = Destination(out, force, keep=storage_files(storage))
    destination.check(out)  # before reading the study: a refused --out costs nothing
    study = load_study(storage, study_name)
    run_time = study_run_time(study, epochs, price_per_hour)
    best_trial = export_winner(study, fmt, destination, run_time)
    if out != "-":
        console.print(
            f"wrote {for_rich(out)} ({fmt}: {exported_as(study, fmt)}): trial #{best_trial.number}, "
            f"{best_trial.samples_per_s:.1f} samples/s ({best_trial.config.short()})"
        )
    for note in [*export_notes(best_trial, study, out, fmt), *filter(None, [run_time])]:
        err_console.print(f"note: {for_rich(note)}")  # stderr: `--out -` keeps stdout to the export itself


@app.command()
def dashboard(
    storage: option.Storage = DEFAULT_STORAGE,
    host: option.Host = "127.0.0.1",
    port: option.Port = 8080,
) -> None:
    """Serve optuna-dashboard on the study storage: OOM and over-ceiling trials shown infeasible, a note per study."""
    from autotune.plan import port as check_port
    from autotune.storage import redact
    from autotune.views.dashboard import exposure_warning, serve

    check_port(port)
    if (warning := exposure_warning(host)) is not None:
        err_console.print(warning)

    def listening(url: str) -> None:
        console.print(f"optuna-dashboard on {redact(storage)}: {url} (Ctrl-C to stop)", soft_wrap=True)
        sys.stdout.flush()

    serve(storage, host, port, listening)


@app.command()
def report(
    out: option.ReportOut = "report.html",
    storage: option.Storage = DEFAULT_STORAGE,
    study_name: option.Study = None,
    force: option.Force = False,
    epochs: option.Epochs = None,
    price_per_hour: option.PricePerHour = None,
) -> None:
    """Write one self-contained HTML page of plotly figures: speed vs memory, history, lever effects, timeline, ranking."""
    from autotune.plan import run_options
    from autotune.spec.files import Destination
    from autotune.storage import load_study, storage_files
    from autotune.views.report import write_report
    from autotune.views.text import for_rich

    run_options(epochs, price_per_hour)
    destination = Destination(out, force, keep=storage_files(storage))
    destination.check(out)  # before reading the study: a refused --out costs nothing
    study = load_study(storage, study_name)
    write_report(study, destination, epochs, price_per_hour)
    if out != "-":  # `--out -` keeps stdout to the page itself
        console.print(
            f"wrote {for_rich(out)}: report of study {for_rich(repr(study.study_name))} ({len(study.trials)} trials)"
        )


@app.command()
def verify(
    storage: option.Storage = DEFAULT_STORAGE,
    study_name: option.Study = None,
    device: option.VerifyDevice = None,
    gpu: option.VerifyGpu = None,
    repeats: option.Repeats = VerifyOptions.repeats,
    tolerance: option.Tolerance = None,
    callbacks: option.Callbacks = None,
    profile: option.Profile = False,
) -> None:
    """Measure the study's winner and the trainer's default again, interleaved, on the study's device: exit 0
    if its answer still holds on today's install, 1 if it regressed beyond the noise (run it after `pip install -U`)."""
    options = VerifyOptions(storage, study_name, device, gpu, repeats, tolerance, tuple(callbacks or ()), profile)
    options.check()  # before the heavy imports: a wrong option is answered at once
    from autotune.storage import load_study
    from autotune.study import stop_as_on_ctrl_c
    from autotune.study import verify as verify_study
    from autotune.views.verify import VerifyPrinter, study_answer

    study = load_study(storage, study_name)
    answer = study_answer(study)
    printer = VerifyPrinter(console, study, answer, repeats)
    printer.started()
    received = stop_as_on_ctrl_c()
    try:
        verification = verify_study(study, answer, options, printer.rerun)
    except KeyboardInterrupt:
        err_console.print("verify interrupted: nothing was recorded")
        raise typer.Exit(128 + received[-1]) from None
    raise typer.Exit(printer.finished(verification))


@app.command()
def devices(
    calibrate: option.Calibrate = False,
    device: option.CalibrateDevice = None,
    seconds: option.CalibrateSeconds = 1.0,
    matrix_size: option.MatrixSize = None,
    known: option.Known = False,
) -> None:
    """List the devices autotune can use with their peaks; --calibrate measures achievable peaks."""
    from autotune.plan import calibration_targets

    targets = calibration_targets(calibrate, known, device, seconds, matrix_size)  # all checked before measuring
    if known:
        from autotune.views.devices_display import known_gpus_table

        console.print(known_gpus_table())
        return
    from autotune.runner import calibrate_bandwidth, calibrate_device, calibrate_op_rates
    from autotune.spec.devices import list_devices
    from autotune.spec.measured_peaks import load_measured_peaks, save_calibration
    from autotune.views.devices_display import calibrated_peaks_text, devices_table

    for spec in targets:
        console.print(f"calibrating {spec.label} ({spec.name}): timing matmuls in {', '.join(spec.supported_dtypes)}")
        peaks = calibrate_device(spec, matrix_size=matrix_size, seconds=seconds)
        bandwidth, ops = calibrate_bandwidth(spec, seconds=seconds), calibrate_op_rates(spec, seconds=seconds)
        console.print(calibrated_peaks_text(spec, peaks, save_calibration(spec, peaks, bandwidth, ops), bandwidth, ops))
    found = list_devices()
    table, notes = devices_table(found, {spec.name: load_measured_peaks(spec.name) for spec in found})
    console.print(table)
    for note in notes:
        console.print(f"note: {note}")


@app.command("chat-corpus")
def chat_corpus(
    out: option.CorpusOut,
    samples: option.Samples,
    seed: option.Seed = 0,
    fmt: option.CorpusFormat = "messages",
    length_scale: option.LengthScale = 1.0,
    force: option.Force = False,
) -> None:
    """Write a generated multi-turn chat corpus, or a trainer's own rows (nothing downloaded), for --dataset."""
    from autotune.plan import within
    from autotune.spec.files import Destination
    from autotune.trainers import corpus_rows_words, write_corpus

    for name, value in (("--samples", samples), ("--seed", seed), ("--length-scale", length_scale)):
        within(name, value)
    tokens, rows = write_corpus(Destination(out, force), samples, seed, fmt, length_scale), corpus_rows_words(fmt)
    console.print(f"wrote {out}: {samples} {rows} ({fmt}), {tokens} tokens under the synthetic tokenizer")
