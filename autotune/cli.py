"""The ``autotune`` command line: each command checks its options, makes one call, prints.

All the work happens in the modules it calls (docs/architecture.md is the map). Options that several
commands share are declared once, below.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Annotated

import typer
from rich.console import Console

from autotune.errors import AutotuneError
from autotune.plan import EstimateOptions, SearchOptions
from autotune.storage import DEFAULT_STORAGE

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

# Options shared by several commands.
ModelOption = Annotated[str, typer.Option(help="Local model directory, Hugging Face id, or catalog name.")]
GpuOption = Annotated[int | None, typer.Option(help="CUDA device number.")]
DeviceOption = Annotated[str | None, typer.Option(help="cpu, cuda or cuda:N (default cpu unless --gpu).")]
SeqLenOption = Annotated[int, typer.Option(help="Tokens per training sample.")]
CeilingOption = Annotated[str, typer.Option(help="Fraction of device memory (0.9) or a size (14GiB).")]
SpaceOption = Annotated[str | None, typer.Option(help="Search space YAML (default: search_spaces/default.yaml).")]
TaskOption = Annotated[str | None, typer.Option(help="sequence-classification, causal-lm or masked-lm.")]
StorageOption = Annotated[str, typer.Option(help="Optuna storage URL (sqlite:///file.db or postgresql://...).")]
StudyOption = Annotated[str | None, typer.Option(help="Study name (default: the only study in the storage).")]


@app.command()
def search(
    model: ModelOption,
    gpu: GpuOption = None,
    device: DeviceOption = None,
    seq_len: SeqLenOption = SearchOptions.seq_len,
    memory_ceiling: CeilingOption = SearchOptions.memory_ceiling,
    host_memory_ceiling: Annotated[
        str | None,
        typer.Option(
            help="Host RAM a trial may use (ZeRO offload puts optimizer states there): a fraction of the available RAM or a size (default: all available)."
        ),
    ] = None,
    space: SpaceOption = None,
    storage: StorageOption = DEFAULT_STORAGE,
    study_name: Annotated[str | None, typer.Option(help="Default: <model>-<device>-s<seq-len>.")] = None,
    trials: Annotated[int, typer.Option(help="Trials to run in this invocation.")] = SearchOptions.trials,
    timeout: Annotated[float | None, typer.Option(help="Stop starting trials after this many seconds.")] = None,
    trial_timeout: Annotated[
        float, typer.Option(help="Kill a trial after this many seconds.")
    ] = SearchOptions.trial_timeout,
    compile_timeout: Annotated[
        float,
        typer.Option(
            help="torch.compile trials: seconds to compile (until the first step ends), then --trial-timeout."
        ),
    ] = SearchOptions.compile_timeout,
    task: TaskOption = None,
    warmup_steps: Annotated[
        int, typer.Option(help="Optimizer steps excluded from timing.")
    ] = SearchOptions.warmup_steps,
    max_measure_steps: Annotated[
        int, typer.Option(help="Measured optimizer steps at most, per trial.")
    ] = SearchOptions.max_measure_steps,
    work_dir: Annotated[str, typer.Option(help="Where trials keep their logs.")] = SearchOptions.work_dir,
    gpus: Annotated[
        str | None, typer.Option(help="CUDA devices to use at once, e.g. 0,1,2,3: one trial per GPU.")
    ] = None,
    workers: Annotated[
        int, typer.Option(help="CPU only: trials to run at once (they share the cores).")
    ] = SearchOptions.workers,
    devices_per_trial: Annotated[
        int,
        typer.Option(
            help="Ranks each trial spans (torchrun-style data parallel): GPUs of --gpus per trial, or gloo ranks on the CPU."
        ),
    ] = SearchOptions.devices_per_trial,
    max_total_trials: Annotated[
        int | None, typer.Option(help="Study-wide cap over all workers and machines: complete + running trials.")
    ] = None,
    confirm_top: Annotated[
        int, typer.Option(help="At the end, re-measure this many leading configs interleaved (0: skip).")
    ] = SearchOptions.confirm_top,
    confirm_repeats: Annotated[
        int, typer.Option(help="Re-runs of each config when confirming, at most.")
    ] = SearchOptions.confirm_repeats,
    confirm_budget: Annotated[
        float,
        typer.Option(
            help="After the confirmation's first round (one re-run of each leading config, always run), start no "
            "re-run that would take its time past this share of the search's time before it (above 0, up to 1)."
        ),
    ] = SearchOptions.confirm_budget,
    callbacks: Annotated[
        list[str] | None,
        typer.Option(
            "--callback",
            hidden=True,
            help="module:Class of an extra TrainerCallback for every trial (repeatable); fault injection, probes.",
        ),
    ] = None,
    dataset: Annotated[
        str | None,
        typer.Option(
            help="Your data: a datasets.save_to_disk directory, or JSONL/text files (default: synthetic tokens)."
        ),
    ] = None,
    text_column: Annotated[str | None, typer.Option(help="The --dataset column to train on (default: found).")] = None,
    packing: Annotated[
        bool, typer.Option(help="Pack --dataset documents into full --seq-len blocks instead of padding.")
    ] = SearchOptions.packing,
    trainer: Annotated[
        str | None,
        typer.Option(
            help="trainer (transformers' Trainer) or sft (TRL's SFTTrainer on your rows); default: sft for a "
            "--dataset of messages or prompt/completion rows, else trainer."
        ),
    ] = None,
    loss_on: Annotated[
        str | None,
        typer.Option(
            help="--trainer sft: the tokens the loss is taken on: all, completion (prompt/completion rows) or "
            "assistant (chat rows); default: TRL's (completion for prompt/completion rows, else all)."
        ),
    ] = None,
    base_args: Annotated[
        str | None,
        typer.Option(
            help="JSON of TrainingArguments (SFTConfig under --trainer sft) you fix (learning_rate, ...): kept in "
            "every trial and the export."
        ),
    ] = None,
    peft: Annotated[
        str | None,
        typer.Option(help="Train LoRA adapters in every trial: lora, qlora, or your adapter_config.json / YAML."),
    ] = None,
    global_batch: Annotated[
        int | None,
        typer.Option(help="Search only micro-batch x accumulation = this (per device); the export keeps it."),
    ] = None,
    max_global_batch: Annotated[
        int | None, typer.Option(help="Search only micro-batch x accumulation <= this.")
    ] = None,
    prune_ratio: Annotated[
        float, typer.Option(help="Stop a trial measured below this fraction of the best feasible samples/s (0: never).")
    ] = SearchOptions.prune_ratio,
    screen: Annotated[
        bool,
        typer.Option(
            "--screen/--no-screen", help="Skip configs the memory estimate or a measured OOM says cannot fit."
        ),
    ] = SearchOptions.screen,
    patience: Annotated[
        int | None,
        typer.Option(
            help="Stop once this many trials in a row did not raise the best model TFLOPs by more than the measured noise."
        ),
    ] = None,
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
    from autotune.views import search_display
    from autotune.views.dashboard import save_study_note

    printer = search_display.SearchPrinter(
        console, err_console, options.trials, confirm_top, confirm_repeats, confirm_budget
    )
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
    model: ModelOption,
    seq_len: SeqLenOption = EstimateOptions.seq_len,
    gpu: GpuOption = None,
    device: DeviceOption = None,
    gpu_type: Annotated[
        str | None, typer.Option(help="Plan for a GPU you do not have (autotune devices --known lists them).")
    ] = None,
    space: SpaceOption = None,
    memory_ceiling: CeilingOption = EstimateOptions.memory_ceiling,
    task: TaskOption = None,
    storage: Annotated[
        str | None, typer.Option(help="Calibrate on the measured trials of a study in this storage.")
    ] = None,
    study_name: StudyOption = None,
    all_rows: Annotated[bool, typer.Option("--all", help="Every memory-distinct config, by part.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Every row as JSON (levers, parts in bytes, total).")] = False,
    devices_per_trial: Annotated[
        int, typer.Option(help="Ranks per trial (as search's): one rank's peak, with plain DDP's gradient buckets.")
    ] = EstimateOptions.devices_per_trial,
    peft: Annotated[
        str | None,
        typer.Option(help="Plan LoRA adapters (as search's --peft): lora, qlora, or your adapter_config.json / YAML."),
    ] = None,
) -> None:
    """Predict peak memory without running anything: per dtype x checkpointing x optimizer, the largest
    micro-batch that fits (--all: every config by part; --json: every config for scripts)."""
    # Every parameter is an estimate option, by the same name.
    options = EstimateOptions(**locals())
    options.check()  # before the heavy imports: a wrong option is answered at once
    from autotune.estimate import estimate_json, largest_fitting, plan_rows, what_would_fit
    from autotune.plan import plan
    from autotune.study import margin_for, memory_fit_of_study
    from autotune.units import format_bytes
    from autotune.views.plan_display import (
        estimate_short_table,
        estimate_table,
        host_memory_note,
        shows_host_memory,
        what_would_fit_table,
    )

    planned = plan(options)  # the search's plan: the same model, adapters, prior and space
    model_spec, device_spec, ceiling = planned.workload.model, planned.workload.device, planned.workload.ceiling_bytes
    fit = planned.prior
    if storage is not None:
        fit = memory_fit_of_study(storage, study_name, model_spec, seq_len, device_spec, fit)
    choices = planned.space.choices
    rows = plan_rows(model_spec, choices, seq_len, fit, ceiling)
    advice = what_would_fit(model_spec, choices, seq_len, fit, ceiling, device_spec)
    where = f"{gpu_type} ({device_spec.name}, datasheet)" if gpu_type else f"{device_spec.label} ({device_spec.name})"
    if as_json:
        header = {
            "model": model_spec.name,
            "seq_len": seq_len,
            "device": where,
            "device_kind": device_spec.kind,
            "device_memory_bytes": device_spec.total_memory_bytes,
            "ceiling_bytes": ceiling,
            "estimator": fit.describe(),
            "space_notes": list(planned.notes),
            "nothing_fits": advice.sentence() if advice else None,
        }
        typer.echo(estimate_json(rows, header))
        return
    for note in planned.notes:
        console.print(f"[dim]note: {note}[/]")
    memory = (
        "peak RSS of the trial's process tree" if device_spec.kind == "cpu" else "device memory as nvidia-smi shows it"
    )
    title = f"Predicted peak memory ({memory}) of {model_spec.name}, seq len {seq_len}, on {where}, ceiling {format_bytes(ceiling)}"
    if all_rows:
        console.print(
            estimate_table(
                f"{title}: {len(rows)} memory-distinct configs of {planned.space.size}",
                [(row.config, row.estimate) for row in rows],
                ceiling,
                margin_for(fit),
            )
        )
    else:
        console.print(estimate_short_table(title, largest_fitting(rows), ceiling))
    if advice is not None:
        console.print(what_would_fit_table(advice))
    if shows_host_memory([row.estimate for row in rows]):
        console.print(host_memory_note(device_spec.kind))
    console.print(f"estimator: {fit.describe()}")


@app.command()
def best(
    storage: StorageOption = DEFAULT_STORAGE,
    study_name: StudyOption = None,
    all: Annotated[bool, typer.Option("--all", help="Every trial, failures included, in trial order.")] = False,
    top: Annotated[int, typer.Option(help="Rows to show.")] = 20,
) -> None:
    """Print the ranked feasible configurations of a study (or every trial with --all)."""
    from autotune.plan import positive_int

    positive_int("--top", top)
    from autotune.storage import load_study
    from autotune.views.ranking import all_trials, confirmations_of, describe_distinct
    from autotune.views.search_display import print_ranking, trial_table

    study = load_study(storage, study_name)
    if not all:
        print_ranking(console, study, top)
        return
    rows = all_trials(study.get_trials(deepcopy=False), confirmations_of(study))
    console.print(trial_table(f"All trials of {study.study_name}", rows))
    console.print(describe_distinct(study.get_trials(deepcopy=False)), markup=False, highlight=False)


@app.command()
def export(
    out: Annotated[
        str | None,
        typer.Option(
            help="File to write ('-': standard output). Default: best_args.json/.txt/.py, accelerate_config.yaml, "
            "best_trl_sft.sh, best_axolotl.yaml, best_llama_factory.yaml."
        ),
    ] = None,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="json (TrainingArguments(**json.load(f)); SFTConfig's under --trainer sft), cli (HF example script "
            "flags), python, accelerate; an SFT study also: trl (the `trl sft` line), axolotl, llama-factory (YAML).",
        ),
    ] = "json",
    storage: StorageOption = DEFAULT_STORAGE,
    study_name: StudyOption = None,
) -> None:
    """Write the winner's TrainingArguments: JSON, script flags, a Python snippet or an accelerate config."""
    from autotune.storage import load_study
    from autotune.views.export import DEFAULT_OUT, FORMATS, export_notes, export_winner

    if fmt not in FORMATS:
        raise AutotuneError(f"--format {fmt!r} is not known: choose one of {', '.join(FORMATS)}")
    out = out or DEFAULT_OUT[fmt]
    study = load_study(storage, study_name)
    best_trial = export_winner(study, fmt, out)
    if out != "-":
        console.print(
            f"wrote {out} ({fmt}): trial #{best_trial.number}, {best_trial.samples_per_s:.1f} samples/s ({best_trial.config.short()})"
        )
    for note in export_notes(best_trial, study, out, fmt):
        err_console.print(f"note: {note}")  # stderr: `--out -` keeps stdout to the export itself


@app.command()
def dashboard(
    storage: StorageOption = DEFAULT_STORAGE,
    host: Annotated[
        str, typer.Option(help="Address to listen on. The dashboard has no login: keep it on loopback.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = 8080,
) -> None:
    """Serve optuna-dashboard on the study storage: OOM and over-ceiling trials shown infeasible, a note per study."""
    from autotune.plan import port as check_port
    from autotune.storage import redact
    from autotune.views.dashboard import is_loopback, serve

    check_port(port)
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
    storage: StorageOption = DEFAULT_STORAGE,
    study_name: StudyOption = None,
) -> None:
    """Write one self-contained HTML page of plotly figures: speed vs memory, history, lever effects, timeline, ranking."""
    from autotune.storage import load_study
    from autotune.views.report import write_report

    study = load_study(storage, study_name)
    write_report(study, out)
    if out != "-":  # `--out -` keeps stdout to the page itself
        console.print(f"wrote {out}: report of study {study.study_name!r} ({len(study.trials)} trials)")


@app.command()
def devices(
    calibrate: Annotated[
        bool, typer.Option("--calibrate", help="Measure the achievable matmul TFLOPS per dtype and store it.")
    ] = False,
    device: Annotated[str | None, typer.Option(help="With --calibrate: only this device (cpu, cuda:N).")] = None,
    seconds: Annotated[float, typer.Option(help="With --calibrate: seconds of timed matmuls per dtype.")] = 1.0,
    matrix_size: Annotated[
        int | None, typer.Option(help="With --calibrate: n of the n x n matmuls (default 2048 on CPU, 8192 on GPU).")
    ] = None,
    known: Annotated[
        bool, typer.Option("--known", help="List the GPUs autotune estimate --gpu-type plans for.")
    ] = False,
) -> None:
    """List the devices autotune can use with their peaks; --calibrate measures achievable peaks."""
    if known:
        from autotune.views.plan_display import known_gpus_table

        if calibrate:
            raise AutotuneError(
                "--known lists GPUs from the datasheet table; --calibrate measures this machine's: give one"
            )
        console.print(known_gpus_table())
        return
    from autotune.plan import positive_int, positive_seconds
    from autotune.runner import calibrate_device
    from autotune.spec.devices import list_devices, resolve_device
    from autotune.spec.measured_peaks import load_measured_peaks, save_calibration
    from autotune.views.plan_display import calibrated_peaks_text, devices_table

    positive_seconds("--seconds", seconds)
    positive_int("--matrix-size", matrix_size)
    found = list_devices()
    if calibrate:
        targets = [resolve_device(device, None)] if device is not None else found
        for spec in targets:
            console.print(
                f"calibrating {spec.label} ({spec.name}): timing matmuls in {', '.join(spec.supported_dtypes)}"
            )
            peaks = calibrate_device(spec, matrix_size=matrix_size, seconds=seconds)
            console.print(calibrated_peaks_text(spec, peaks, save_calibration(spec, peaks)))
    table, notes = devices_table(found, {spec.name: load_measured_peaks(spec.name) for spec in found})
    console.print(table)
    for note in notes:
        console.print(f"note: {note}")


@app.command("chat-corpus")
def chat_corpus(
    out: Annotated[str, typer.Option(help="JSON lines file to write.")],
    samples: Annotated[int, typer.Option(help="Conversations to write.")],
    seed: Annotated[int, typer.Option(help="The corpus: the same seed writes the same conversations.")] = 0,
    fmt: Annotated[
        str,
        typer.Option(
            "--format", help="messages, prompt-completion (the last assistant turn is the completion) or text (ChatML)."
        ),
    ] = "messages",
    length_scale: Annotated[
        float, typer.Option(help="Multiply every turn's median length (1: public chat data's; 0.25 for --seq-len 256).")
    ] = 1.0,
) -> None:
    """Write a generated multi-turn chat corpus (nothing downloaded) for --dataset."""
    from autotune.spec.chat_corpus import write_jsonl

    tokens = write_jsonl(out, samples, seed, fmt, length_scale)
    console.print(f"wrote {out}: {samples} conversations ({fmt}), {tokens} tokens under the synthetic tokenizer")


def main() -> None:
    """Console entry point: user errors become one line on stderr and exit status 2."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        app()
    except AutotuneError as exc:
        err_console.print(f"autotune: error: {exc}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    except optuna.exceptions.StorageInternalError as exc:
        # A full disk or a lost database at ask, at the start of a trial: nothing measured is at stake
        # (a failed tell keeps its result, see study._record.tell_or_keep).
        from autotune.storage import storage_failure

        err_console.print(
            f"autotune: error: the study storage failed ({storage_failure(exc)}); free space or fix the database, "
            f"then run the same command again",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(2)
