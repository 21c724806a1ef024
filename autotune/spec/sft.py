"""What an SFT study trains on and which loss (``--loss-on``): the workload's, fixed for a study and
never searched, like ``--peft``. The trainer itself (``--trainer sft``, TRL's ``SFTTrainer``) is
``autotune.trainers.sft``; this module holds the rows' formats and the loss, which the parent checks.

TRL's ``SFTTrainer`` is what most people who fine-tune an LLM today launch, directly or under axolotl
and LLaMA-Factory. Each trial hands it the user's rows as they are (``messages`` rendered with the
tokenizer's chat template, ``prompt``/``completion``, or ``text``), and TRL prepares, truncates, packs
and batches them itself (trl/trainer/sft_trainer.py, ``_prepare_dataset`` and
``DataCollatorForLanguageModeling``), exactly as the user's run does. By default a ``--dataset`` of
chat (``messages``) or ``prompt``/``completion`` rows trains under ``sft``, anything else under
``trainer``; ``--trainer sft`` also takes a ``text`` dataset.

The loss (``--loss-on``): ``all`` tokens, the ``completion`` of prompt/completion rows, or what the
``assistant`` says in chat rows (``SFTConfig.completion_only_loss`` / ``assistant_only_loss``,
sft_trainer.py:933-964, :1407-1434). It changes which labels are -100, never which tokens go
forward and backward: model FLOPs, throughput and memory count every real token alike
(docs/facts.md, "SFT"). Its default is TRL's: ``completion`` for prompt/completion rows, ``all``
otherwise (sft_trainer.py:959-964). ``--base-args`` may say the same through those two fields; a
contradiction is refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autotune.errors import AutotuneError

LOSS_ON = ("all", "completion", "assistant")
# The dataset formats TRL's SFTTrainer reads (trl/data_utils.py: is_conversational; sft_trainer.py
# _prepare_dataset), by the columns that name them.
FORMATS = ("messages", "prompt-completion", "text")
FORMAT_COLUMNS = {"messages": ("messages",), "prompt-completion": ("prompt", "completion"), "text": ("text",)}


def data_format(columns: Sequence[str]) -> str | None:
    """The SFT format of a dataset with these columns (:data:`FORMATS`), ``None`` for none of them."""
    if "messages" in columns:
        return "messages"
    if "prompt" in columns and "completion" in columns:
        return "prompt-completion"
    if "text" in columns:
        return "text"
    return None


def default_loss_on(data: str) -> str:
    """TRL's own choice: completion-only loss for prompt/completion rows, all tokens otherwise
    (``completion_only_loss=None``, sft_trainer.py:959-964)."""
    return "completion" if data == "prompt-completion" else "all"


def loss_on_arguments(loss_on: str) -> dict[str, bool]:
    """The ``SFTConfig`` fields that say ``loss_on``, both written, so nothing is left to TRL's default."""
    return {"completion_only_loss": loss_on == "completion", "assistant_only_loss": loss_on == "assistant"}


def loss_on_from_base_args(base_args: Mapping[str, Any], data: str) -> str | None:
    """The loss the user's ``--base-args`` fix, as TRL reads them for ``data``; ``None`` if they set neither field.

    Raises:
        AutotuneError: Both set on (TRL would train the assistant's tokens inside the completion only).
    """
    if "completion_only_loss" not in base_args and "assistant_only_loss" not in base_args:
        return None
    assistant = bool(base_args.get("assistant_only_loss"))
    completion = base_args.get("completion_only_loss")
    completion = data == "prompt-completion" if completion is None else bool(completion)
    if assistant and completion:
        raise AutotuneError(
            "--base-args: completion_only_loss and assistant_only_loss are both on: keep one (or use --loss-on)"
        )
    return "assistant" if assistant else "completion" if completion else "all"


def resolve_loss_on(option: str | None, base_args: Mapping[str, Any], data: str, first_row: Mapping[str, Any]) -> str:
    """The study's loss: ``--loss-on``, else what ``--base-args`` fix, else TRL's default for ``data``.

    Raises:
        AutotuneError: An unknown value, ``--loss-on`` and ``--base-args`` saying different things, or a
            loss the rows cannot have (no prompt/completion split, no conversation).
    """
    if option is not None and option not in LOSS_ON:
        raise AutotuneError(f"--loss-on {option}: choose one of {', '.join(LOSS_ON)}")
    fixed = loss_on_from_base_args(base_args, data)
    if option is not None and fixed is not None and option != fixed:
        raise AutotuneError(
            f"--loss-on {option} contradicts --base-args (completion_only_loss / assistant_only_loss say {fixed}): give one"
        )
    loss_on = option or fixed or default_loss_on(data)
    if loss_on == "completion" and data != "prompt-completion":
        raise AutotuneError(
            f"--loss-on completion needs prompt and completion columns; the dataset holds {data} rows "
            "(for chat rows use --loss-on assistant)"
        )
    if loss_on == "assistant" and not _conversational(first_row):
        raise AutotuneError(
            "--loss-on assistant needs conversations (messages, or prompt/completion as lists of messages); "
            f"the dataset holds {data} rows as text"
        )
    return loss_on


def _conversational(row: Mapping[str, Any]) -> bool:
    """TRL's test of a conversational row (trl/data_utils.py ``is_conversational``): a list of role/content dicts."""
    for key in ("messages", "prompt", "completion"):
        value = row.get(key)
        if isinstance(value, list) and value and isinstance(value[0], dict) and "role" in value[0]:
            return True
    return False


def check_chat_template(tokenizer: Any, loss_on: str, data: str) -> None:
    """The tokenizer can render the rows and mark what the assistant says, as SFTTrainer will need.

    ``messages`` are rendered with the tokenizer's chat template (sft_trainer.py:1371-1379);
    ``assistant`` loss needs ``{% generation %}`` markers, which TRL swaps in only for templates it
    knows (sft_trainer.py:941-944; trl/chat_template_utils.py ``get_training_chat_template``).

    Raises:
        AutotuneError: No chat template, or one TRL cannot mark the assistant's tokens in.
    """
    if data != "text" and not getattr(tokenizer, "chat_template", None):
        raise AutotuneError(
            f"--dataset holds {data} rows and the tokenizer has no chat_template to render them: "
            "add one to the model directory's tokenizer_config.json"
        )
    if loss_on != "assistant":
        return
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    if has_generation_markers(tokenizer.chat_template):
        return
    try:
        get_training_chat_template(tokenizer)
    except ValueError as exc:
        raise AutotuneError(
            f"--loss-on assistant: TRL cannot mark the assistant's tokens in this chat template ({str(exc).splitlines()[0]}); "
            "add {% generation %} markers to it, or use --loss-on all"
        ) from None


def trains_untruncated(arguments: Mapping[str, Any]) -> bool:
    """Whether SFTTrainer leaves samples at their full length: ``max_length=None``, which a lever may ask
    for (TRL's padding-free batches without packing require it, sft_trainer.py:999-1004). The trial
    child then truncates the tokenized samples to ``--seq-len`` itself, as TRL's own truncation does."""
    return "max_length" in arguments and arguments["max_length"] is None


def sft_arguments(arguments: Mapping[str, Any], seq_len: int, loss_on: str) -> dict[str, Any]:
    """The ``SFTConfig`` keyword arguments of a trial: the levers' and the user's (``arguments``, every
    lever off value already explicit where SFTConfig's default differs), the loss, and ``max_length``
    from ``--seq-len`` unless a lever set it."""
    return {**arguments, **loss_on_arguments(loss_on), "max_length": arguments.get("max_length", seq_len)}


def work_counted(loss_on: str) -> str:
    """What the model TFLOPs that rank an SFT study count, in one sentence (``autotune best`` prints it)."""
    labels = {"all": "every token", "completion": "the completions", "assistant": "what the assistant says"}
    return (
        "model TFLOPs count every real (non-padding) token of the measured steps, forward and backward, the "
        f"attention over each sample's own length; the loss on {labels[loss_on]} changes the labels, not that work"
    )
