"""Preference pairs for DPO, generated from the chat corpus (``autotune.spec.chat_corpus``): nothing downloaded.
DPO's ``chat-corpus --format`` forms (``autotune.trainers.dpo``: ``corpus_forms``).

A preference row is what TRL's ``DPOTrainer`` reads (trl/trainer/dpo_trainer.py, ``_prepare_dataset``:
a ``prompt``, a ``chosen`` and a ``rejected`` completion, plain strings or lists of messages): here
conversation number ``index`` of the chat corpus, whose last assistant turn is the ``chosen``
completion and everything before it (ending on a user turn) the prompt, plus a ``rejected`` assistant
turn drawn from the same length distribution, independently. Public preference sets pair two
answers to one prompt that differ in content and length alike (UltraFeedback binarized draws both from
four models' answers: huggingface.co/datasets/HuggingFaceH4/ultrafeedback_binarized, README); what a
training step costs is the prompt's length plus both answers', which the draw carries.

Two written forms (:data:`PREFERENCE_FORMS`, ``chat-corpus --format``):

* ``preference``: conversational, ``prompt`` a list of messages, ``chosen`` and ``rejected`` one
  assistant message each (TRL applies the chat template: ``add_generation_prompt=True`` for the prompt);
* ``preference-text``: plain strings, the prompt rendered in ChatML up to the assistant's header
  (:data:`autotune.spec.chat_corpus.CHATML_TEMPLATE`), each answer its words (TRL appends the EOS
  token, ``<|im_end|>`` under the synthetic tokenizer, to a plain answer that lacks it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autotune.errors import AutotuneError
from autotune.spec.chat_corpus import (
    DEFAULT_SHAPE,
    MESSAGE_OVERHEAD_TOKENS,
    ChatShape,
    conversation,
    conversation_tokens,
    render_chatml,
    words,
    write_rows,
)
from autotune.spec.files import Destination
from autotune.trainers._kind import CorpusForm

PREFERENCE_FORMATS = ("preference", "preference-text")
# The rejected answer's stream of random numbers, apart from the conversation's ([seed, index]).
_REJECTED_STREAM = 1


def preference_pair(
    index: int, seed: int = 0, shape: ChatShape = DEFAULT_SHAPE
) -> tuple[list[dict[str, str]], dict[str, str], dict[str, str]]:
    """Pair number ``index`` of the corpus ``seed``: the prompt's messages, the chosen and the rejected
    assistant message. The prompt and the chosen answer are the chat corpus's conversation ``index``."""
    messages = conversation(index, seed, shape)
    rng = np.random.default_rng([seed, index, _REJECTED_STREAM])
    rejected = {"role": "assistant", "content": words(rng, int(shape.assistant.draw(rng, 1)[0]))}
    return messages[:-1], messages[-1], rejected


def pair_tokens(prompt: list[dict[str, str]], chosen: dict[str, str], rejected: dict[str, str]) -> int:
    """Tokens a DPO step reads of a pair under the synthetic tokenizer: the prompt twice (once before each
    answer: TRL's collator concatenates prompt + chosen and prompt + rejected) and both answers, in ChatML."""
    answer_tokens = len(rejected["content"].split()) + MESSAGE_OVERHEAD_TOKENS
    return conversation_tokens([*prompt, chosen]) + conversation_tokens(prompt) + answer_tokens


def as_preference_row(
    prompt: list[dict[str, str]], chosen: dict[str, str], rejected: dict[str, str], fmt: str
) -> dict[str, Any]:
    """One pair in the written form ``fmt`` (:data:`PREFERENCE_FORMATS`)."""
    if fmt == "preference":
        return {"prompt": prompt, "chosen": [chosen], "rejected": [rejected]}
    if fmt == "preference-text":
        text = render_chatml(prompt, add_generation_prompt=True)
        return {"prompt": text, "chosen": chosen["content"], "rejected": rejected["content"]}
    raise AutotuneError(f"--format {fmt!r} is not a form of preference pairs: {', '.join(PREFERENCE_FORMATS)}")


def preference_rows(samples: int, seed: int = 0, fmt: str = "preference", length_scale: float = 1.0) -> list[dict]:
    """The corpus's first ``samples`` pairs in the written form ``fmt``."""
    shape = DEFAULT_SHAPE.scaled(length_scale)
    return [as_preference_row(*preference_pair(index, seed, shape), fmt) for index in range(samples)]


def write_pairs(out: str | Destination, samples: int, seed: int, fmt: str, length_scale: float) -> int:
    """Write the corpus's first ``samples`` pairs in the form ``fmt`` (:data:`PREFERENCE_FORMATS`), one pair
    a line, as ``chat_corpus.write_rows`` writes them, and return their tokens under the synthetic tokenizer
    (as :func:`pair_tokens` counts them).

    Raises:
        AutotuneError: What ``chat_corpus.write_rows`` refuses.
    """
    shape = DEFAULT_SHAPE.scaled(length_scale)

    def row(index: int) -> tuple[dict[str, Any], int]:
        pair = preference_pair(index, seed, shape)
        return as_preference_row(*pair, fmt), pair_tokens(*pair)

    return write_rows(out, samples, row)


def _form(fmt: str, words: str) -> CorpusForm:
    return CorpusForm(
        words=f"DPO's preference pairs, {words}",
        rows_words="preference pairs",
        write=lambda out, samples, seed, length_scale: write_pairs(out, samples, seed, fmt, length_scale),
    )


# DPO's forms of `autotune chat-corpus --format` (its ``corpus_forms``).
PREFERENCE_FORMS = {
    fmt: _form(fmt, words) for fmt, words in zip(PREFERENCE_FORMATS, ("messages", "strings"), strict=True)
}
