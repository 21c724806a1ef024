"""The command line's Typer declarations: each option's type and help text, written once for every command.

``autotune.cli`` annotates its parameters with these (``model: option.Model``); each default stays
with its command (from :class:`~autotune.plan.SearchOptions` / :class:`~autotune.plan.EstimateOptions`
where there is one). Typer names each option after its parameter (``seq_len``: ``--seq-len``) unless the
declaration names it. Imported by name, not through the package face: only the command line pays for
importing Typer.
"""

from __future__ import annotations

from typing import Annotated

import typer

from autotune import trainers

# --- search and estimate: what a plan is built from -----------------------------------------------------
Model = Annotated[str, typer.Option(help="Local model directory, Hugging Face id, or catalog name.")]
Gpu = Annotated[int | None, typer.Option(help="CUDA device number.")]
Device = Annotated[str | None, typer.Option(help="cpu, cuda or cuda:N (default cpu unless --gpu).")]
SeqLen = Annotated[int, typer.Option(help="Tokens per training sample.")]
Ceiling = Annotated[str, typer.Option(help="Fraction of device memory (0.9) or a size (14GiB).")]
HostCeiling = Annotated[
    str | None,
    typer.Option(
        help="Host RAM a trial may use, its ranks together (ZeRO offload puts optimizer states there, TRL's activation offloading activations): a fraction of the available RAM or a size (default: the available RAM, shared by the trials that run at once)."
    ),
]
# The default of each task is autotune.space.DEFAULT_SPACES' (not imported here: the command line stays light;
# tests/plan/test_options.py checks these words against it).
Space = Annotated[
    str | None,
    typer.Option(
        help="Search space YAML (default: search_spaces/llm.yaml for a causal-lm model, "
        "search_spaces/default.yaml for any other task)."
    ),
]
Task = Annotated[str | None, typer.Option(help="sequence-classification, causal-lm or masked-lm.")]
Peft = Annotated[
    str | None,
    typer.Option(help="Train LoRA adapters in every trial: lora, qlora, or your adapter_config.json / YAML."),
]
EstimatePeft = Annotated[
    str | None,
    typer.Option(help="Plan LoRA adapters (as search's --peft): lora, qlora, or your adapter_config.json / YAML."),
]
DevicesPerTrial = Annotated[
    int,
    typer.Option(
        help="Ranks each trial spans (torchrun-style data parallel): GPUs of --gpus per trial, or gloo ranks on the CPU."
    ),
]
EstimateDevicesPerTrial = Annotated[
    int, typer.Option(help="Ranks per trial (as search's): one rank's peak, with plain DDP's gradient buckets.")
]

# --- the study storage -----------------------------------------------------------------------------------
Storage = Annotated[str, typer.Option(help="Optuna storage URL (sqlite:///file.db or postgresql://...).")]
Study = Annotated[str | None, typer.Option(help="Study name (default: the only study in the storage).")]
NewStudy = Annotated[str | None, typer.Option(help="Default: <model>-<device>-s<seq-len>.")]

# --- search: the workload every trial measures ------------------------------------------------------------
Trials = Annotated[int, typer.Option(help="Trials to run in this invocation.")]
Timeout = Annotated[float | None, typer.Option(help="Stop starting trials after this many seconds.")]
TrialTimeout = Annotated[float, typer.Option(help="Kill a trial after this many seconds.")]
CompileTimeout = Annotated[
    float,
    typer.Option(help="torch.compile trials: seconds to compile (until the first step ends), then --trial-timeout."),
]
WarmupSteps = Annotated[int, typer.Option(help="Optimizer steps excluded from timing.")]
MaxMeasureSteps = Annotated[int, typer.Option(help="Measured optimizer steps at most, per trial.")]
WorkDir = Annotated[str, typer.Option(help="Where trials keep their logs.")]
Gpus = Annotated[str | None, typer.Option(help="CUDA devices to use at once, e.g. 0,1,2,3: one trial per GPU.")]
Workers = Annotated[int, typer.Option(help="CPU only: trials to run at once (they share the cores).")]
MaxTotalTrials = Annotated[
    int | None, typer.Option(help="Study-wide cap over all workers and machines: complete + running trials.")
]
ConfirmTop = Annotated[
    int,
    typer.Option(
        help="At the end, re-measure this many leading configs interleaved, and the HF default beside them for the "
        "speedup (0: skip)."
    ),
]
ConfirmRepeats = Annotated[int, typer.Option(help="Re-runs of each config when confirming, at most.")]
ConfirmBudget = Annotated[
    float,
    typer.Option(
        help="After the confirmation's first round (one re-run of each leading config and of the HF default, "
        "always run), start no re-run that would take its time past this share of the search's time before it "
        "(above 0, up to 1)."
    ),
]
Callbacks = Annotated[
    list[str] | None,
    typer.Option(
        "--callback",
        hidden=True,
        help="module:Class of an extra TrainerCallback for every trial (repeatable); fault injection, probes.",
    ),
]
Dataset = Annotated[
    str | None,
    typer.Option(help="Your data: a datasets.save_to_disk directory, or JSONL/text files (default: synthetic tokens)."),
]
TextColumn = Annotated[str | None, typer.Option(help="The --dataset column to train on (default: found).")]
Packing = Annotated[bool, typer.Option(help="Pack --dataset documents into full --seq-len blocks instead of padding.")]
Trainer = Annotated[
    str | None,
    typer.Option(help=trainers.option_help()),
]
LossOn = Annotated[
    str | None,
    typer.Option(
        help="--trainer sft: the tokens the loss is taken on: all, completion (prompt/completion rows) or "
        "assistant (chat rows); default: TRL's (completion for prompt/completion rows, else all)."
    ),
]
BaseArgs = Annotated[
    str | None,
    typer.Option(
        help="A JSON file, or JSON inline ('{\"learning_rate\": 1e-4}'), of TrainingArguments (SFTConfig under "
        "--trainer sft, DPOConfig under --trainer dpo) you fix (learning_rate, max_steps, ...): kept in every trial "
        "and the export."
    ),
]
GlobalBatch = Annotated[
    int | None,
    typer.Option(help="Search only micro-batch x accumulation = this (per device); the export keeps it."),
]
MaxGlobalBatch = Annotated[int | None, typer.Option(help="Search only micro-batch x accumulation <= this.")]
PruneRatio = Annotated[
    float, typer.Option(help="Stop a trial measured below this fraction of the best feasible samples/s (0: never).")
]
Screen = Annotated[
    bool,
    typer.Option("--screen/--no-screen", help="Skip configs the memory estimate or a measured OOM says cannot fit."),
]
Patience = Annotated[
    int | None,
    typer.Option(
        help="Stop once this many trials in a row did not raise the best model TFLOPs by more than the measured noise."
    ),
]

# --- the user's whole run: search, estimate, best, export, report (autotune.result.run_length) ----------
Epochs = Annotated[
    float | None,
    typer.Option(
        help="Epochs of your whole run, for its projected wall time (default: num_train_epochs or max_steps "
        "from --base-args, else 3, TrainingArguments' default; best/export/report: the search's)."
    ),
]
PricePerHour = Annotated[
    float | None,
    typer.Option(help="Price of one device-hour, to print the run's cost (best/export/report: default the search's)."),
]

# --- estimate: where it plans, what it prints -------------------------------------------------------------
GpuType = Annotated[
    str | None, typer.Option(help="Plan for a GPU you do not have (autotune devices --known lists them).")
]
CalibrationStorage = Annotated[
    str | None, typer.Option(help="Calibrate on the measured trials of a study in this storage.")
]
AllConfigs = Annotated[bool, typer.Option("--all", help="Every memory-distinct config, by part.")]
Json = Annotated[bool, typer.Option("--json", help="Every row as JSON (levers, parts in bytes, total).")]

# --- best, export, report, dashboard ----------------------------------------------------------------------
# The `trl` command lines the trainers' exports write (each trainer's ToolExport.trl_command).
_TRL_COMMANDS = " or ".join(f"trl {kind.tool_export.trl_command}" for kind in trainers.REGISTERED if kind.tool_export)
AllTrials = Annotated[bool, typer.Option("--all", help="Every trial, failures included, in trial order.")]
Top = Annotated[int, typer.Option(help="Rows to show.")]
ExportOut = Annotated[
    str | None,
    typer.Option(
        help="File to write ('-': standard output). Default: best_args.json/.txt/.py, accelerate_config.yaml, "
        f"best_trl.sh ({_TRL_COMMANDS}), best_axolotl.yaml, best_llama_factory.yaml."
    ),
]
ExportFormat = Annotated[
    str,
    typer.Option(
        "--format",
        help="json (TrainingArguments(**json.load(f)); SFTConfig's under --trainer sft), cli (HF example script "
        "flags), python, accelerate; an SFT study also: trl (the `trl sft` line), axolotl, llama-factory (YAML).",
    ),
]
ReportOut = Annotated[str, typer.Option(help="HTML file to write (self-contained: opens offline).")]
Force = Annotated[
    bool,
    typer.Option(
        "--force", help="Replace an existing --out file (never the study's database, which the command reads)."
    ),
]
Host = Annotated[str, typer.Option(help="Address to listen on. The dashboard has no login: keep it on loopback.")]
Port = Annotated[int, typer.Option(help="Port to listen on (0: any free port).")]

# --- devices ----------------------------------------------------------------------------------------------
Calibrate = Annotated[
    bool, typer.Option("--calibrate", help="Measure the achievable matmul TFLOPS per dtype and store it.")
]
CalibrateDevice = Annotated[str | None, typer.Option(help="With --calibrate: only this device (cpu, cuda:N).")]
CalibrateSeconds = Annotated[
    float,
    typer.Option(
        help="With --calibrate: seconds of timed square matmuls per dtype (a CPU as long again at narrow inner sizes)."
    ),
]
MatrixSize = Annotated[
    int | None, typer.Option(help="With --calibrate: n of the n x n matmuls (default 2048 on CPU, 8192 on GPU).")
]
Known = Annotated[bool, typer.Option("--known", help="List the GPUs autotune estimate --gpu-type plans for.")]

# --- chat-corpus ------------------------------------------------------------------------------------------
CorpusOut = Annotated[str, typer.Option(help="JSON lines file to write.")]
Samples = Annotated[int, typer.Option(help="Conversations to write.")]
Seed = Annotated[int, typer.Option(help="The corpus: the same seed writes the same conversations.")]
CorpusFormat = Annotated[
    str,
    typer.Option(
        "--format",
        help="messages, prompt-completion (the last assistant turn is the completion), text (ChatML)"
        + "".join(f", {fmt} ({form.words})" for fmt, form in trainers.corpus_forms().items())
        + ".",
    ),
]
LengthScale = Annotated[
    float, typer.Option(help="Multiply every turn's median length (1: public chat data's; 0.25 for --seq-len 256).")
]

# --- verify -----------------------------------------------------------------------------------------------
VerifyDevice = Annotated[
    str | None,
    typer.Option(
        help="Measure on this device (cpu, cuda:N) instead of the search's: the same device model the study measured on."
    ),
]
VerifyGpu = Annotated[
    int | None,
    typer.Option(
        help="Measure on this CUDA device instead of the search's: the same device model the study measured on."
    ),
]
Repeats = Annotated[int, typer.Option(help="Re-runs of the winner and of the trainer's default each, interleaved.")]
Profile = Annotated[
    bool,
    typer.Option(
        help="Then run the winner and the trainer's default once more each under torch's profiler, and say where "
        "their steps' time went (those runs are not judged: profiling slows a step)."
    ),
]
Tolerance = Annotated[
    float | None,
    typer.Option(
        help="The slowdown (or memory growth) allowed, as a fraction of the recorded figure (0.1: 10 %), instead "
        "of the study's measured noise."
    ),
]
