"""Export the winner's TrainingArguments: exactly the arguments its trial trained with.

Every format derives from one dict, :func:`winner_arguments` (the single mapping
:func:`autotune.levers._trial_config.training_arguments_kwargs`): ``json`` for ``TrainingArguments(**json.load(f))``,
``cli`` for the flags HF example scripts parse with ``HfArgumentParser``, ``python`` for a
``TrainingArguments(...)`` snippet, ``accelerate`` for the part an accelerate config can carry
(mixed precision, CPU, torch.compile); each rendered by :mod:`autotune.views.trainer_formats`.

A study under ``--trainer sft`` or ``--trainer dpo`` trained TRL's ``SFTConfig`` or ``DPOConfig``: its
``json``, ``cli`` and ``python`` are that class's (:func:`autotune.views.sft_export.config_arguments`),
and three more formats say the same for the tools people launch (:data:`TOOL_FORMATS`, each a trainer's
``tool_forms``: ``trl sft`` / ``trl dpo``, axolotl, LLaMA-Factory). What a study's trainer exports is its
trainer's answer (``autotune.trainers``: ``arguments_subclass``, ``tool_forms``, ``tool_export``,
``exported_as``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import optuna

from autotune.errors import AutotuneError
from autotune.levers import (
    DYNAMIC_SHAPES_ENVIRONMENT,
    LEVERS,
    optimizer_in,
    training_arguments_kwargs,
    update_ignores_gradient_scale,
)
from autotune.result import TrialResult, accumulation_note
from autotune.spec.files import Destination, writes_beside
from autotune.spec.peft import adapter_config_json, adapter_config_path
from autotune.spec.peft import export_note as peft_export_note
from autotune.storage import schema
from autotune.trainers import DEFAULT, REGISTERED, TrainerKind, tool_form_owner
from autotune.units import format_bytes
from autotune.views.ranking import RankedTrial, study_ranking, study_trainer, why_none_finished, winner_summary
from autotune.views.sft_export import (
    ToolWinner,
    config_arguments,
    config_flags,
    config_note,
    model_to_load,
    trl_command,
)
from autotune.views.sft_tool_yaml import axolotl_yaml, llama_factory_yaml
from autotune.views.text import shell_line
from autotune.views.trainer_formats import accelerate_config, cli_flags, json_text, python_snippet, training_default


def winner(study: optuna.Study) -> RankedTrial:
    ranking = study_ranking(study)  # the confirmed winner, where the search confirmed one
    if not ranking:
        raise AutotuneError(f"study {study.study_name!r} has no feasible trial to export: {why_none_finished(study)}")
    return ranking[0]


def winner_arguments(study: optuna.Study, fmt: str = "json") -> dict[str, Any]:
    """The TrainingArguments keyword arguments of the study's best feasible trial, for ``fmt``: the
    Trainer's formats undo the gradient scale of a winner whose accumulation the Trainer sums
    (:func:`for_the_trainer`)."""
    best = winner(study)
    arguments = trained_arguments(study, best)
    if fmt == "accelerate":
        return arguments
    arguments = for_the_trainer(arguments, best.result)
    kind = study_trainer(study)
    if kind.arguments_subclass:  # the SFTConfig / DPOConfig the trial trained with, every differing default written
        identity = study.user_attrs.get(schema.STUDY_IDENTITY) or {}
        return config_arguments(kind, arguments, best.config, int(identity["seq_len"]), str(identity["loss_on"]))
    return arguments


def trained_arguments(study: optuna.Study, best: RankedTrial) -> dict[str, Any]:
    """The arguments ``best``'s trial trained with (the one mapping, and the precision that ran)."""
    device_kind = study.user_attrs.get(schema.STUDY_DEVICE_KIND, "cpu")
    arguments = training_arguments_kwargs(best.config, device_kind, study.user_attrs.get(schema.STUDY_BASE_ARGS) or {})
    return with_precision_that_ran(arguments, best.result)


def for_the_trainer(arguments: dict[str, Any], result: TrialResult | None) -> dict[str, Any]:
    """The arguments that train with the Trainer as at accumulation 1 where the trial's Trainer added
    up its micro-batches' mean losses (:attr:`TrialResult.gradient_scale` k above 1; transformers 5
    ``trainer.py``, ``training_step``): its gradients are k times the per-sample ones.

    Exact corrections only: ``max_grad_norm`` times k, so clipping acts on the same per-sample norm;
    with SGD at weight decay 0, ``learning_rate`` over k, since its update is the gradient times the
    rate (momentum is linear in it). An optimizer whose update ignores the gradient's scale (AdamW,
    Adafactor, ...: :func:`autotune.levers.update_ignores_gradient_scale`) needs nothing more; for any
    other no argument undoes it, and :func:`accumulation_export_note` says so.
    """
    steps = result.gradient_scale if result is not None else 1
    if steps <= 1:
        return arguments
    corrected = dict(arguments)
    clip = arguments.get("max_grad_norm", training_default("max_grad_norm"))
    if clip:
        corrected["max_grad_norm"] = clip * steps
    if _optimizer_of(arguments) == "sgd" and not _weight_decay_of(arguments):
        corrected["learning_rate"] = arguments.get("learning_rate", training_default("learning_rate")) / steps
    return corrected


def _optimizer_of(arguments: dict[str, Any]) -> str:
    return optimizer_in(arguments, training_default)


def _weight_decay_of(arguments: dict[str, Any]) -> float:
    return float(arguments.get("weight_decay", training_default("weight_decay")))


def accumulation_export_note(trained: dict[str, Any], result: TrialResult | None, fmt: str) -> str | None:
    """What the export did about a winner whose Trainer added up its micro-batches' mean losses, and
    what it could not do; ``None`` for any other winner.

    Args:
        trained: The arguments the winner's trial trained with (:func:`trained_arguments`).
        result: Its result.
        fmt: The export's format: the accelerate format is not corrected, since in the user's own
            loop ``Accelerator.backward`` divides the loss by the accumulation steps
            (accelerate/accelerator.py, ``backward``).
    """
    if result is None or accumulation_note(result) is None:
        return None
    steps = result.gradient_scale
    said = (
        f"the winner's model ignores num_items_in_batch, so at gradient_accumulation_steps={steps} the Trainer adds "
        f"up {steps} micro-batch mean losses: the loss it logs and its gradients are {steps}x the per-sample ones"
    )
    if fmt == "accelerate":
        return said + " (in your own loop Accelerator.backward divides by the accumulation steps: nothing to change)"
    corrected = for_the_trainer(trained, result)
    changes = [
        f"{name} {corrected[name]:g} (was {trained.get(name, training_default(name)):g})"
        for name in ("max_grad_norm", "learning_rate")
        if corrected.get(name) != trained.get(name)
    ]
    done = f"; exported {' and '.join(changes)}" if changes else ""
    optim = _optimizer_of(trained)
    if update_ignores_gradient_scale(optim, _weight_decay_of(trained)) or (optim == "sgd" and "learning_rate" in done):
        return said + done + f", so {optim} trains as at accumulation 1 with the same global batch (up to its epsilon)"
    return (
        said
        + done
        + f"; {optim} at weight_decay {_weight_decay_of(trained):g} has no argument that undoes it exactly: "
        "subclass the Trainer with loss_is_scaled_for_ga = False (transformers trainer.py) to have it divide by the steps"
    )


def with_precision_that_ran(arguments: dict[str, Any], result: TrialResult | None) -> dict[str, Any]:
    """Write down the TF32 matmuls a trial ran in although its arguments did not ask for them.

    An fp32 + ``torch_compile`` trial runs TF32 because transformers switches it on when ``tf32`` is
    unset (transformers/training_args.py, "── 9. TF32 ──"). The exported ``tf32: true`` makes the same
    precision explicit, so the user reads what was measured and a later transformers that stopped
    switching it on still reproduces it. Nothing changes where the user fixed ``tf32`` themselves.
    """
    if result is None or result.peak_dtype != "tf32" or "tf32" in arguments:
        return arguments
    return {**arguments, "tf32": True}


def exported_as(study: optuna.Study, fmt: str) -> str:
    """What the export in ``fmt`` holds, in words: an SFT study's arguments are ``SFTConfig``'s (a DPO study's
    ``DPOConfig``'s), which ``TrainingArguments`` refuses (``assistant_only_loss``, ``max_length``, ...), a
    Trainer study's ``TrainingArguments``'."""
    kind = study_trainer(study)
    if fmt not in kind.exported_as:  # a tool's form of another trainer, which render refuses
        kind = tool_form_owner(fmt) or kind
    return kind.exported_as[fmt]


# The formats of the tools built on a trainer (TRL's: trl, axolotl, LLaMA-Factory): a study of such a trainer only.
TOOL_FORMATS = tuple(dict.fromkeys(fmt for kind in REGISTERED for fmt in kind.tool_forms))
FORMATS = ("json", "cli", "python", "accelerate", *TOOL_FORMATS)
DEFAULT_OUT = {
    "json": "best_args.json",
    "cli": "best_args.txt",
    "python": "best_args.py",
    "accelerate": "accelerate_config.yaml",
    "trl": "best_trl.sh",
    "axolotl": "best_axolotl.yaml",
    "llama-factory": "best_llama_factory.yaml",
}


def export_out(fmt: str, out: str | None) -> str:
    """Where ``--format fmt`` writes: ``--out``, else the format's own file name (an unknown format: one line)."""
    if fmt not in FORMATS:
        raise AutotuneError(f"--format {fmt!r} is not known: choose one of {', '.join(FORMATS)}")
    return out or DEFAULT_OUT[fmt]


def launch_note(ranks: int, deepspeed: bool = False) -> str | None:
    """How to launch a winner measured on ``ranks`` ranks: torch's launcher, one process per device
    (the trials ran exactly so: autotune/runner/_launch.py), the global batch shared by all.

    A winner that trains with DeepSpeed needs the launcher on one rank too: DeepSpeed initialises
    torch.distributed from the launcher's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and LOCAL_RANK,
    and without them looks for MPI (deepspeed/comm/comm.py, ``init_distributed`` -> ``mpi_discovery``):
    a plain ``python your_script.py`` fails there (``No module named 'mpi4py'``, or an MPI world it
    did not ask for)."""
    if ranks == 1 and not deepspeed:
        return None
    command = f"`torchrun --nproc-per-node {ranks} your_script.py`"
    if not deepspeed:
        return (
            f"the winner was measured on {ranks} ranks: launch {command} "
            f"(or `accelerate launch --num_processes {ranks}`); the global batch is per_device_train_batch_size "
            f"x gradient_accumulation_steps x {ranks}"
        )
    batch = (
        f"; the global batch is per_device_train_batch_size x gradient_accumulation_steps x {ranks}"
        if ranks > 1
        else ""
    )
    return (
        f"the winner trains with DeepSpeed, which needs a launcher even on one rank: launch {command} (or "
        f"`deepspeed --num_gpus {ranks} your_script.py` on GPUs, or `accelerate launch` with --format accelerate's "
        f"config); a plain `python your_script.py` fails in DeepSpeed's mpi_discovery (deepspeed/comm/comm.py: it "
        f"looks for MPI when the launcher's RANK, WORLD_SIZE and MASTER_ADDR are not set){batch}"
    )


def ranks_of(study: optuna.Study | None) -> int:
    """The ranks each trial of ``study`` spanned (``--devices-per-trial``, kept in its identity)."""
    if study is None:
        return 1
    return int((study.user_attrs.get(schema.STUDY_IDENTITY) or {}).get("devices_per_trial", 1))


def model_loading_note(best: RankedTrial, trainer: TrainerKind = DEFAULT) -> str | None:
    """What the winner depends on that its arguments do not say (the model build, the data collator,
    what TRL requires of the rows): each lever's own note (``autotune.levers``). Under SFT the model's
    build is in the arguments' ``model_init_kwargs`` (:func:`autotune.views.sft_export.config_note`)."""
    notes = [
        lever.export_note(getattr(best.config, lever.name))
        for lever in LEVERS.values()
        if not (trainer.arguments_subclass and lever.acts_on == "model")
    ]
    return "; ".join(note for note in notes if note) or None


def allocator_note(best: RankedTrial) -> str | None:
    """The allocator settings the winner was measured under, which its peak memory depends on:
    ``expandable_segments:True`` (the Docker image sets it) leaves less reserved-over-allocated
    memory than the default segments, and other settings (``max_split_size_mb``,
    ``garbage_collection_threshold``) change it too: a run without them may need more memory than
    the study measured. TrainingArguments cannot carry an environment variable, so it is said here.
    """
    settings = {k: v for k, v in (best.result.runtime if best.result else {}).items() if k.endswith("ALLOC_CONF")}
    if not settings:
        return None
    exports = " ".join(f"{name}={value}" for name, value in sorted(settings.items()))
    return f"the winner's peak memory was measured under {exports}: set the same in the training's environment"


def compile_environment(best: RankedTrial | None) -> dict[str, str]:
    """The environment the winner compiled in that its arguments cannot carry: dynamic shapes from the
    first step where its batches varied (``autotune.levers.compile_environment``), as its trial read it
    back from accelerate's compile plugin (``runtime["compile_dynamic"]``); a study from before that
    recorded nothing, and compiled with transformers' default."""
    dynamic = (best.result.runtime if best is not None and best.result else {}).get("compile_dynamic")
    return dict(DYNAMIC_SHAPES_ENVIRONMENT) if dynamic == "True" else {}


def compile_environment_note(best: RankedTrial) -> str | None:
    """How to compile the winner as its trial did: one compile for batches of every length."""
    environment = compile_environment(best)
    if not environment:
        return None
    exports = " ".join(f"{name}={value}" for name, value in sorted(environment.items()))
    return (
        f"the winner compiled with dynamic shapes from its first step, so its batches of varying length compiled "
        f"once: set {exports} in the training's environment (accelerate's TorchDynamoPlugin reads it, "
        "TrainingArguments has no field for it; without it dynamo compiles the first length as a constant and "
        "again at the second)"
    )


def peak_batch_note(best: RankedTrial) -> str | None:
    """Which batch set the winner's peak memory (``--dataset`` with dynamic padding: the worst case
    the data can produce, run once by every trial, or the timed steps)."""
    if best.result is None or not best.result.peak_batch:
        return None
    return (
        f"the winner's peak memory ({format_bytes(best.result.peak_memory_bytes)}) was set by {best.result.peak_batch}"
    )


def deepspeed_config_path(out: str) -> str:
    """Where the export writes the winner's DeepSpeed config beside ``out`` (a regular file:
    :func:`autotune.spec.files.writes_beside`): ``best_args.json`` -> ``best_args.deepspeed.json``."""
    return f"{os.path.splitext(out)[0]}.deepspeed.json"


def with_deepspeed_config_path(arguments: dict[str, Any], out: str) -> dict[str, Any]:
    """The arguments naming the DeepSpeed config file by path (``TrainingArguments(deepspeed=path)``),
    as scripts and launchers pass it; unchanged without ZeRO, or where no file is written beside ``out``
    (standard output, a device): there the config stays a dict in the arguments, which
    ``TrainingArguments`` takes as it is, and as JSON text from a flag (its ``_VALID_DICT_FIELDS``)."""
    if not isinstance(arguments.get("deepspeed"), dict) or not writes_beside(out):
        return arguments
    return {**arguments, "deepspeed": deepspeed_config_path(out)}


def deepspeed_note(best: RankedTrial, out: str) -> str | None:
    """Where the winner's DeepSpeed config is (its arguments carry one), and for offload the host memory it needs."""
    deepspeed = training_arguments_kwargs(best.config, "cuda").get("deepspeed")
    if not isinstance(deepspeed, dict):
        return None
    zero = deepspeed.get("zero_optimization", {})
    stage = f"stage {zero.get('stage')}" + (" with offload" if "offload_optimizer" in zero else "")
    where = (
        f"its config is {deepspeed_config_path(out)}, which the arguments name"
        if writes_beside(out)
        else "its config is in the arguments (deepspeed), since no file is written beside --out " + out
    )
    note = f"the winner trains with DeepSpeed ZeRO {stage}: {where}"
    host = (best.result.memory_peaks if best.result else {}).get(schema.TRIAL_PREDICTED_HOST_BYTES)
    if host:
        note += f"; offload keeps {format_bytes(host)} per rank in host RAM (estimate)"
    return note


def export_notes(
    best: RankedTrial, study: optuna.Study | None = None, out: str = DEFAULT_OUT["json"], fmt: str = "json"
) -> list[str]:
    """What the winner depends on outside TrainingArguments: the model build, the allocator, the
    study's PEFT adapters (written beside ``out``), its DeepSpeed config; which batch set its peak;
    and what was changed for a Trainer that added up its micro-batches' losses."""
    trainer = study_trainer(study)
    found = (
        launch_note(ranks_of(study), _trains_with_deepspeed(study, best)),
        config_note(trainer, winner_arguments(study, "json"))
        if study is not None and trainer.arguments_subclass
        else None,
        model_loading_note(best, trainer),
        allocator_note(best),
        compile_environment_note(best),
        peak_batch_note(best),
        deepspeed_note(best, out),
        accumulation_export_note(trained_arguments(study, best), best.result, fmt) if study is not None else None,
    )
    notes = [note for note in found if note is not None]
    peft_identity = _peft_identity(study)
    if peft_identity is not None:
        task = str((study.user_attrs.get(schema.STUDY_IDENTITY) or {}).get("task", "")) if study is not None else ""
        beside = adapter_config_path(out) if writes_beside(out) else None
        notes.append(peft_export_note(peft_identity, beside, adapter_config_json(peft_identity, task)))
    return notes


def _trains_with_deepspeed(study: optuna.Study | None, best: RankedTrial) -> bool:
    """Whether the winner's arguments name a DeepSpeed config: its ``zero`` lever's, or the user's ``--base-args``."""
    if study is None:
        return training_arguments_kwargs(best.config, "cuda").get("deepspeed") is not None
    return trained_arguments(study, best).get("deepspeed") is not None


def _peft_identity(study: optuna.Study | None) -> dict[str, Any] | None:
    if study is None:
        return None
    return (study.user_attrs.get(schema.STUDY_IDENTITY) or {}).get("peft")


def provenance_of(
    study: optuna.Study,
    best: RankedTrial,
    out: str = DEFAULT_OUT["json"],
    fmt: str = "json",
    run_time: str | None = None,
) -> str:
    """Where an export comes from, in lines for the comments of the formats that take them; ``run_time``:
    the whole run's projected wall time (:func:`autotune.views.run_time.study_run_time`)."""
    lines = [f"autotune: the winner of study {study.study_name!r}: trial {winner_summary(best)}"]
    lines += [f"note: {note}" for note in export_notes(best, study, out, fmt)]
    lines += [run_time] if run_time else []
    return "\n".join(lines)


def render(
    arguments: dict[str, Any], fmt: str, provenance: str = "", ranks: int = 1, tool: ToolWinner | None = None
) -> str:
    """The text of ``arguments`` in one of :data:`FORMATS`; ``tool``: the winner of a study of a TRL trainer,
    whose arguments are its class's (``SFTConfig``, ``DPOConfig``; the formats of :data:`TOOL_FORMATS` need it).

    Raises:
        AutotuneError: An unknown format, or a tool's format for a study of a trainer without it.
    """
    if fmt in TOOL_FORMATS and tool is None:
        owners = [kind for kind in REGISTERED if fmt in kind.tool_forms]
        raise AutotuneError(
            f"--format {fmt} writes a run of {' or '.join(k.words for k in owners)}, and this study trained another "
            f"trainer (search with --trainer {' or '.join(k.name for k in owners)}); use json, cli, python or accelerate"
        )
    if fmt == "json":
        return json_text(arguments)
    if fmt == "cli":
        if tool is not None:
            return shell_line(config_flags(tool.kind, arguments))
        return cli_flags(arguments)
    if fmt == "python":
        if tool is None:
            return python_snippet(arguments, provenance)
        model_note = [tool.model_note] if tool.model_note else []
        header = "\n".join([*provenance.splitlines(), *model_note])
        return python_snippet(arguments, header, tool.kind.arguments_path, tool.model, tool.kind.trainer_class)
    if tool is not None and fmt in TOOL_FORMATS:
        form = {"trl": trl_command, "axolotl": axolotl_yaml, "llama-factory": llama_factory_yaml}[fmt]
        return form(dataclasses.replace(tool, arguments=arguments, provenance=provenance))
    if fmt == "accelerate":
        return accelerate_config(arguments, provenance, ranks)
    raise AutotuneError(f"--format {fmt!r} is not known: choose one of {', '.join(FORMATS)}")


def tool_winner(
    study: optuna.Study, arguments: dict[str, Any], environment: dict[str, str] | None = None
) -> ToolWinner | None:
    """What the tools' formats need of the winner of a study of a TRL trainer (``environment``: what it
    trained in beyond its arguments, :func:`compile_environment`); ``None`` for a study of the Trainer."""
    kind = study_trainer(study)
    if kind.tool_export is None:
        return None
    identity = study.user_attrs.get(schema.STUDY_IDENTITY) or {}
    model, model_note = model_to_load(str(identity.get("model")))
    return ToolWinner(
        kind=kind,
        arguments=arguments,
        model=model,
        dataset=str(identity.get("dataset")),
        loss_on=str(identity.get("loss_on")),
        peft=_peft_identity(study),
        model_note=model_note,
        environment=environment or {},
    )


def export_winner(study: optuna.Study, fmt: str, destination: Destination, run_time: str | None = None) -> RankedTrial:
    """Write the winner's arguments in ``fmt`` to ``destination`` (``-``: standard output), with its
    DeepSpeed config and adapters beside it where it is a regular file (:attr:`Destination.side_files`;
    elsewhere the arguments and the notes carry them); every file under the destination's one rule.
    ``run_time`` joins the header of the formats that take comments.

    Returns:
        The trial that was exported.
    """
    out = destination.out
    best = winner(study)
    arguments = winner_arguments(study, fmt)
    files: dict[str, str] = {}
    text = render(
        with_deepspeed_config_path(arguments, out),
        fmt,
        provenance_of(study, best, out, fmt, run_time),
        ranks_of(study),
        tool_winner(study, arguments, compile_environment(best)),
    )
    files[out] = text
    if destination.side_files:
        if isinstance(arguments.get("deepspeed"), dict):  # ZeRO: the config as JSON beside, named by path
            files[deepspeed_config_path(out)] = json_text(arguments["deepspeed"])
        peft_identity = _peft_identity(study)
        if peft_identity is not None:  # --peft: the adapters the trials trained, beside the arguments
            task = str((study.user_attrs.get(schema.STUDY_IDENTITY) or {}).get("task", ""))
            files[adapter_config_path(out)] = adapter_config_json(peft_identity, task)
    destination.write(files)
    return best
