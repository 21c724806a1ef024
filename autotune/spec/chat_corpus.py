"""A realistic chat corpus that ships with autotune: generated, seedable, nothing downloaded.

Supervised fine-tuning data today is chat: multi-turn conversations (an optional system prompt,
then user and assistant turns alternating, ending on the assistant), whose lengths are what decide
the cost of training on them: how much padding a batch carries, how well packing fills a row, how
many samples a ``max_length`` truncates. This module draws conversations with those lengths; their
words are pseudo-words from a fixed lexicon, since the speed of a training step depends on how
many tokens it holds, not on which tokens.

Lengths are drawn in **tokens of the synthetic tokenizer** (``autotune.spec.synthetic_tokenizer``:
one lexicon word is one token), each turn from a log-normal, so a conversation's token count under
that tokenizer is exactly what was drawn (:func:`conversation_tokens`). A real tokenizer splits
the same words into more tokens; the shape of the distribution is what carries over.

The defaults (:data:`DEFAULT_SHAPE`) resemble public chat SFT sets:

* Multi-turn: UltraChat generates "a 3~7-round dialogue" per question (github.com/thunlp/UltraChat,
  README, "Construction of UltraChat"), while instruction sets such as OpenHermes 2.5 or NVIDIA's
  Llama-Nemotron post-training data are mostly one round (the Nemotron ShareGPT conversion's README
  gives "Average number of turns: 3.00" counting system, user and assistant). Here a conversation
  has 1 round plus another with probability 0.5 each time, at most 6: mean 2.0 rounds, half of them
  single-round.
* Right-skewed lengths: that Nemotron conversion reports, in tokens per conversation, median 393,
  mean 528, standard deviation 658, max 18,718
  (huggingface.co/datasets/MaziyarPanahi/Llama-Nemotron-Post-Training-Dataset-v1-ShareGPT, README
  "Stats"): mean / median 1.34, which for a log-normal is exp(sigma^2 / 2), sigma 0.77. UltraChat
  200k's ``train_sft`` split holds 207,865 conversations in 1,397,058,554 bytes
  (huggingface.co/datasets/HuggingFaceH4/ultrachat_200k, README ``dataset_info``), about 6.7 kB
  each, some 1,500 tokens at 4-4.5 characters a token.
* The defaults give (200,000 drawn conversations, ChatML overhead included) a median of about 516
  tokens, a mean of about 695 (mean / median 1.35), 21 % of the conversations past 1024 tokens
  (TRL's default ``max_length``) and 3.5 % past 2048: between the one-round Nemotron data and the
  multi-round UltraChat, with the long tail past the sequence length that truncation and packing
  meet in real data.

``length_scale`` multiplies every median (the spread stays): a CPU benchmark at ``--seq-len 256``
wants the same shape at a quarter of the scale, or nearly every sample would be truncated.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from autotune.errors import AutotuneError
from autotune.spec.files import Destination, writes_beside
from autotune.units import format_bytes

# The corpus's written forms (``--format``), as TRL's SFTTrainer reads them (trl/trainer/sft_trainer.py,
# ``_prepare_dataset``): conversational language modeling (``messages``), conversational
# prompt-completion (``prompt`` and ``completion`` lists of messages; TRL trains on the completion
# only by default), and plain language modeling (``text``, the conversation rendered in ChatML).
FORMATS = ("messages", "prompt-completion", "text")

ROLES = ("system", "user", "assistant")

# ChatML (the format of Qwen and of OpenAI's chat API), with ``{% generation %}`` around what the
# assistant says, its end-of-turn marker included: transformers' ``apply_chat_template(...,
# return_assistant_tokens_mask=True)`` marks those tokens, which is what TRL's
# ``assistant_only_loss=True`` trains on (trl/trainer/sft_trainer.py, ``tokenize_fn``; and TRL warns
# when the end-of-turn token is left out, ``is_chat_template_stop_token_trained``).
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '" + IM_START + "assistant\\n' }}"
    "{%- generation %}{{- message['content'] + '" + IM_END + "' }}{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '" + IM_START + "' + message['role'] + '\\n' + message['content'] + '" + IM_END + "\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '" + IM_START + "assistant\\n' }}{%- endif %}"
)
# Tokens ChatML adds to a message under the synthetic tokenizer: <|im_start|>, the role, <|im_end|>.
MESSAGE_OVERHEAD_TOKENS = 3

# Pseudo-words of the lexicon: consonant-vowel syllables, shortest words first.
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
LEXICON_SIZE = 8192
# Word frequencies follow Zipf's law, p(rank) ~ 1 / rank^s, s about 1 in natural text.
ZIPF_EXPONENT = 1.0
# No single turn longer than this many tokens (a log-normal has no upper bound).
MAX_TURN_TOKENS = 16384


@dataclasses.dataclass(frozen=True)
class LogNormal:
    """Token counts whose logarithm is normal: ``median * exp(sigma * N(0, 1))``, at least 1."""

    median: float
    sigma: float

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        tokens = np.rint(self.median * np.exp(self.sigma * rng.standard_normal(size)))
        return np.clip(tokens, 1, MAX_TURN_TOKENS).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class ChatShape:
    """How conversations are drawn (the module docstring says where the defaults come from).

    Attributes:
        system_share: Share of conversations that open with a system prompt.
        system: Tokens of a system prompt.
        user: Tokens of a user turn.
        assistant: Tokens of an assistant turn.
        another_round: Probability of one more user/assistant round after each round.
        max_rounds: Rounds at most.
    """

    system_share: float = 0.25
    system: LogNormal = LogNormal(median=24, sigma=0.6)
    user: LogNormal = LogNormal(median=48, sigma=1.0)
    assistant: LogNormal = LogNormal(median=200, sigma=0.75)
    another_round: float = 0.5
    max_rounds: int = 6

    def scaled(self, length_scale: float) -> ChatShape:
        """The same shape with every median multiplied by ``length_scale`` (``--length-scale``, within
        :data:`LENGTH_SCALES`: ``autotune.plan`` checks it)."""

        def scale(lengths: LogNormal) -> LogNormal:
            return dataclasses.replace(lengths, median=lengths.median * length_scale)

        return dataclasses.replace(
            self, system=scale(self.system), user=scale(self.user), assistant=scale(self.assistant)
        )


DEFAULT_SHAPE = ChatShape()
# The --length-scale range: below it the longest median is under one token, above it at MAX_TURN_TOKENS,
# so every turn is drawn at a bound (LogNormal.draw clips) and the scale changes nothing more.
_LONGEST_MEDIAN = max(DEFAULT_SHAPE.system.median, DEFAULT_SHAPE.user.median, DEFAULT_SHAPE.assistant.median)
LENGTH_SCALES = (1 / _LONGEST_MEDIAN, MAX_TURN_TOKENS / _LONGEST_MEDIAN)


@functools.cache
def lexicon() -> tuple[str, ...]:
    """The corpus's :data:`LEXICON_SIZE` words, most frequent first (the same on every machine)."""
    syllables = [c + v for c in _CONSONANTS for v in _VOWELS]
    words: list[str] = []
    level = [""]
    while len(words) < LEXICON_SIZE:
        level = [word + syllable for word in level for syllable in syllables]
        words.extend(level[: LEXICON_SIZE - len(words)])
    return tuple(words)


@functools.cache
def _word_cdf() -> np.ndarray:
    weights = 1.0 / np.arange(1, LEXICON_SIZE + 1) ** ZIPF_EXPONENT
    return np.cumsum(weights / weights.sum())


def words(rng: np.random.Generator, count: int) -> str:
    """``count`` words of the lexicon drawn by their Zipf frequencies, space-separated."""
    ranks = np.minimum(np.searchsorted(_word_cdf(), rng.random(count)), LEXICON_SIZE - 1)
    drawn = lexicon()
    return " ".join(drawn[rank] for rank in ranks)


def conversation(index: int, seed: int = 0, shape: ChatShape = DEFAULT_SHAPE) -> list[dict[str, str]]:
    """Conversation number ``index`` of the corpus ``seed``: it depends on nothing else, so a
    larger corpus of the same seed starts with the smaller one."""
    rng = np.random.default_rng([seed, index])
    messages = []
    if rng.random() < shape.system_share:
        messages.append({"role": "system", "content": words(rng, int(shape.system.draw(rng, 1)[0]))})
    rounds = 1
    while rounds < shape.max_rounds and rng.random() < shape.another_round:
        rounds += 1
    users, assistants = shape.user.draw(rng, rounds), shape.assistant.draw(rng, rounds)
    for user_tokens, assistant_tokens in zip(users, assistants):
        messages.append({"role": "user", "content": words(rng, int(user_tokens))})
        messages.append({"role": "assistant", "content": words(rng, int(assistant_tokens))})
    return messages


def conversations(samples: int, seed: int = 0, shape: ChatShape = DEFAULT_SHAPE) -> Iterator[list[dict[str, str]]]:
    """The corpus's first ``samples`` conversations."""
    for index in range(samples):
        yield conversation(index, seed, shape)


def conversation_tokens(messages: list[dict[str, str]]) -> int:
    """Tokens of a conversation rendered in ChatML under the synthetic tokenizer (one word, one token)."""
    return sum(len(message["content"].split()) + MESSAGE_OVERHEAD_TOKENS for message in messages)


def as_format(messages: list[dict[str, str]], fmt: str) -> dict[str, Any]:
    """One corpus row in the written form ``fmt`` (:data:`FORMATS`)."""
    if fmt == "messages":
        return {"messages": messages}
    if fmt == "prompt-completion":
        # The last assistant turn is the completion; everything before it (ending on a user turn) the prompt.
        return {"prompt": messages[:-1], "completion": messages[-1:]}
    if fmt == "text":
        return {"text": render_chatml(messages)}
    raise AutotuneError(f"--format {fmt!r} is not known: choose one of {', '.join(FORMATS)}")


def render_chatml(messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
    """The conversation as the synthetic tokenizer's chat template renders it (:data:`CHATML_TEMPLATE`),
    with the assistant's header after it where ``add_generation_prompt``."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        conversations=[messages], chat_template=CHATML_TEMPLATE, add_generation_prompt=add_generation_prompt
    )
    return rendered[0]


# --samples at most: five times UltraChat 200k's 207,865 conversations (module docstring), about 3 GB of
# JSON lines at the public data's scale; a corpus any search reads is far smaller.
MAX_SAMPLES = 1_000_000
# Conversations drawn first to estimate the corpus's size, checked against the free space before writing.
SIZE_PROBE_SAMPLES = 64


def write_jsonl(
    out: str | Destination, samples: int, seed: int = 0, fmt: str = "messages", length_scale: float = 1.0
) -> int:
    """Write the corpus as JSON lines, one conversation a line, and return its total tokens
    (under the synthetic tokenizer, ChatML included).

    The file is written as :func:`write_rows` writes it. ``samples``, ``seed`` and ``length_scale`` are
    the command line's, checked there (``autotune.plan.within``: ``--samples`` up to :data:`MAX_SAMPLES`).

    Raises:
        AutotuneError: An unknown format, a destination its rule refuses, too little free space, or a path
            that cannot be written.
    """
    if fmt not in FORMATS:
        raise AutotuneError(f"--format {fmt!r} is not known: choose one of {', '.join(FORMATS)}")
    shape = DEFAULT_SHAPE.scaled(length_scale)

    def row(index: int) -> tuple[dict[str, Any], int]:
        messages = conversation(index, seed, shape)
        return as_format(messages, fmt), conversation_tokens(messages)

    return write_rows(out, samples, row)


def write_rows(out: str | Destination, samples: int, row: Callable[[int], tuple[dict[str, Any], int]]) -> int:
    """Write rows ``row(0)`` to ``row(samples - 1)`` (each a JSON-able row and its tokens) as JSON lines,
    and return their total tokens.

    The file is written whole or not at all (:class:`autotune.spec.files.Destination`: a temporary file
    renamed at the end, removed on an error, a full disk or Ctrl-C), never over an existing file
    unasked; a corpus the free space cannot hold (estimated from its first rows) is refused before
    anything is written.

    Raises:
        AutotuneError: A destination its rule refuses, too little free space, or a path that cannot be written.
    """
    destination = out if isinstance(out, Destination) else Destination(out)
    destination.check(destination.out)
    _check_free_space(destination.out, samples, row)

    def write(stream: TextIO) -> int:
        total = 0
        for index in range(samples):
            written, tokens = row(index)
            stream.write(json.dumps(written) + "\n")
            total += tokens
        return total

    return destination.stream(write)


def _check_free_space(out: str, samples: int, row: Callable[[int], tuple[dict[str, Any], int]]) -> None:
    """Refuse a corpus larger than the free space of ``out``'s file system, its size estimated from its
    first :data:`SIZE_PROBE_SAMPLES` rows (standard output and devices are not checked)."""
    if not writes_beside(out):
        return
    probe = min(samples, SIZE_PROBE_SAMPLES)
    probed = sum(len(json.dumps(row(index)[0]).encode()) + 1 for index in range(probe))
    expected = probed * samples // probe
    try:
        free = shutil.disk_usage(Path(out).resolve().parent).free
    except OSError:
        return  # no such directory: writing says so in one line
    if expected > free:
        raise AutotuneError(
            f"--samples {samples}: the corpus would take about {format_bytes(expected)} and {out}'s file system has "
            f"{format_bytes(free)} free: write fewer samples (or a smaller --length-scale), or free space"
        )
