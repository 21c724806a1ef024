"""The winner's arguments as text, one function a format: ``json``, ``cli`` (``HfArgumentParser``
flags), ``python`` (a ``TrainingArguments(...)``, ``SFTConfig(...)`` or ``DPOConfig(...)`` call) and
``accelerate`` (an ``accelerate launch`` config). :func:`autotune.views.export.render` picks one; the TRL
tools' formats are :mod:`autotune.views.sft_export`'s. What they read of transformers' arguments class (the parser's
arities, :func:`training_default`) is kept on disk, so a search's study note does not import it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import yaml

from autotune.errors import AutotuneError
from autotune.spec.derived_cache import cached
from autotune.trainers import DEFAULT
from autotune.views.text import comment_lines, shell_line


def json_text(arguments: dict[str, Any]) -> str:
    """The ``json`` format (see :func:`write_json`)."""
    return json.dumps(arguments, indent=2, sort_keys=True) + "\n"


def cli_flags(arguments: dict[str, Any]) -> str:
    """The ``cli`` format: one shell-quoted line of ``--field value`` flags for ``HfArgumentParser``.

    Booleans that are on become a bare ``--flag`` where the parser reads that as True, else
    ``--flag True``; off ones are spelled ``--flag False``. Lists become several values where the parser takes several
    (``nargs="+"``), one value where it takes one (``report_to``: ``str | list[str]``); dicts
    become JSON, which ``TrainingArguments`` parses for its dict fields. ``None`` and empty lists
    mean "the default" and are left out.

    Raises:
        AutotuneError: A list of several values for a field the parser takes one value of.
    """
    nargs = _parser_nargs()
    tokens: list[str] = []
    for name, value in arguments.items():
        if value is None or (isinstance(value, (list, tuple)) and not value):
            continue
        if value is True:
            tokens += [f"--{name}"] if nargs.get(name) == "?" else [f"--{name}", "True"]
        elif value is False:
            tokens += [f"--{name}", "False"]
        elif isinstance(value, (list, tuple)):
            if len(value) > 1 and nargs.get(name) not in ("+", "*"):
                raise AutotuneError(
                    f"--format cli cannot carry {name}={list(value)!r}: script parsers take one value for it; "
                    "use --format json or python"
                )
            tokens += [f"--{name}", *(str(item) for item in value)]
        elif isinstance(value, dict):
            tokens += [f"--{name}", json.dumps(value, sort_keys=True)]
        else:
            tokens += [f"--{name}", str(value)]
    return shell_line(tokens)


def _parser_nargs() -> dict[str, Any]:
    """How many values ``HfArgumentParser`` reads for each TrainingArguments flag (``--name`` only).

    Kept on disk (:mod:`autotune.spec.derived_cache`): every search's study note renders the ``cli``
    format, and importing ``TrainingArguments`` to build the parser costs a search's parent process
    about 4 s of CPU more than its start already spent (transformers imports PEFT, and PEFT
    bitsandbytes, under it; measured on a 2-core machine) for a figure that changes only with the
    installed transformers.
    """
    return cached("parser-nargs", {}, __file__, _parser_nargs_of_transformers)


def _parser_nargs_of_transformers() -> dict[str, Any]:
    from transformers import HfArgumentParser, TrainingArguments

    parser = HfArgumentParser(TrainingArguments)
    return {action.dest: action.nargs for action in parser._actions if f"--{action.dest}" in action.option_strings}


def training_default(name: str) -> Any:
    """TrainingArguments' own default for ``name``, a field whose default is a number, a string, a bool or None.

    Kept on disk per installed versions (:mod:`autotune.spec.derived_cache`): the study note at the end of
    every search exports the winner, and for one that accumulated (its clipping, learning rate and optimizer)
    importing the arguments class cost the search's parent 8 s of CPU (12 s against 3.6 s for a one-trial
    search on a 2-core machine; transformers imports PEFT and bitsandbytes under it; docs/benchmarks.md "The
    test suite"), as it did for the checkpointing field (issue 29).
    """
    return cached("training-defaults", {}, __file__, _training_defaults_of_transformers)[name]


def _training_defaults_of_transformers() -> dict[str, Any]:
    from transformers import TrainingArguments

    defaults: dict[str, Any] = {}
    for field in dataclasses.fields(TrainingArguments):
        value = getattr(field.default, "value", field.default)  # an enum member (OptimizerNames, ...): its value
        if value is None or isinstance(value, (str, int, float, bool)):
            defaults[field.name] = value
    return defaults


def python_snippet(
    arguments: dict[str, Any],
    provenance: str = "",
    arguments_path: str = DEFAULT.arguments_path,
    model: str | None = None,
    trainer_class: str = DEFAULT.trainer_class,
) -> str:
    """The ``python`` format: a ``TrainingArguments(...)`` call (TRL's ``SFTConfig(...)`` for an SFT
    study: ``arguments_path``, the study's trainer's ``module:Class``) with every argument as a literal;
    ``model``: the name a TRL study's model loads by, which its trainer (``trainer_class``: ``SFTTrainer``,
    ``DPOTrainer``) takes as ``model=...`` (it applies the arguments' ``model_init_kwargs`` then)."""
    module, _, name = arguments_path.partition(":")
    lines = comment_lines([provenance] if provenance else [])
    lines += [
        f"from {module} import {name}",
        "",
        "# Add output_dir=... to choose where checkpoints go.",
        f"training_args = {name}(",
    ]
    lines += [f"    {name}={value!r}," for name, value in arguments.items()]
    lines.append(")")
    if model is not None:
        lines += [
            f"# {trainer_class.partition(':')[2]}(model=model_name, args=training_args, ...) loads it with "
            "model_init_kwargs.",
            f"model_name = {model!r}",
        ]
    return "\n".join(lines) + "\n"


def accelerate_config(arguments: dict[str, Any], provenance: str = "", ranks: int = 1) -> str:
    """The ``accelerate`` format: an ``accelerate launch --config_file`` YAML, for scripts that build
    their own ``Accelerator()``.

    An accelerate config carries mixed precision, CPU use, torch.compile (dynamo) and the processes
    of a winner measured on ``ranks`` ranks (``num_processes``, data parallel: ``MULTI_GPU``, or
    ``MULTI_CPU`` with ``use_cpu``; accelerate.utils.DistributedType); the comment at its top lists
    the winner's other arguments, which belong in the script.

    A ZeRO winner's arguments name its DeepSpeed config file (``deepspeed``): the config is then
    ``DEEPSPEED`` with that file, which ``accelerate launch`` hands to the script's ``Accelerator()``
    (``ACCELERATE_USE_DEEPSPEED``, accelerate/utils/launch.py ``prepare_deepspeed_cmd_env``); any other
    type trains without DeepSpeed, silently. accelerate refuses a ``mixed_precision`` in a config that
    names a DeepSpeed file (accelerate/utils/dataclasses.py, ``DeepSpeedPlugin._deepspeed_config_checks``):
    the precision, which fills the file's ``"auto"`` bf16/fp16, goes on the launch line instead.
    """
    if arguments.get("bf16"):
        mixed_precision = "bf16"
    elif arguments.get("fp16"):
        mixed_precision = "fp16"
    else:
        mixed_precision = "no"
    deepspeed = arguments.get("deepspeed")
    if deepspeed is not None and not isinstance(deepspeed, str):
        raise AutotuneError("--format accelerate names the DeepSpeed config by its file: write it to a file first")
    if deepspeed is not None:
        distributed_type = "DEEPSPEED"
    else:
        distributed_type = "NO" if ranks == 1 else "MULTI_CPU" if arguments.get("use_cpu") else "MULTI_GPU"
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": distributed_type,
        **({"deepspeed_config": {"deepspeed_config_file": deepspeed}} if deepspeed is not None else {}),
        "num_machines": 1,
        "num_processes": ranks,
        "machine_rank": 0,
        **({"mixed_precision": mixed_precision} if deepspeed is None else {}),
        "use_cpu": bool(arguments.get("use_cpu", False)),
        "debug": False,
    }
    if arguments.get("torch_compile"):
        config["dynamo_config"] = {
            # accelerate names backends in upper case (accelerate.utils.DynamoBackend).
            "dynamo_backend": str(arguments.get("torch_compile_backend") or "inductor").upper(),
            "dynamo_mode": str(arguments.get("torch_compile_mode") or "default"),
        }
    carried = {"bf16", "fp16", "use_cpu", "torch_compile", "torch_compile_backend", "torch_compile_mode", "deepspeed"}
    rest = {name: value for name, value in arguments.items() if name not in carried}
    header = comment_lines([provenance] if provenance else [])
    if deepspeed is None:
        header.append("# accelerate launch --config_file <this file> train.py")
    else:
        header += [
            f"# accelerate launch --config_file <this file> --mixed_precision {mixed_precision} train.py",
            "# (the DeepSpeed file's bf16/fp16 'auto' follow --mixed_precision, which accelerate refuses in a "
            "config that names a DeepSpeed file)",
        ]
    header.append("# accelerate has no config field for these; set them in your script:")
    header += comment_lines([f"{name} = {value!r}" for name, value in rest.items()], prefix="#   ")
    if arguments.get("tf32"):
        header.append("#   (tf32: torch.backends.cuda.matmul.allow_tf32 = True before training)")
    if "gradient_accumulation_steps" in rest:
        header.append(
            f"#   (accumulation: Accelerator(gradient_accumulation_steps={rest['gradient_accumulation_steps']!r}))"
        )
    return "\n".join(header) + "\n" + yaml.safe_dump(config, sort_keys=False)
