"""The rows of an SFT study checked as TRL's ``SFTTrainer`` will read them: once, in the parent, before any trial.

Each trial hands ``SFTTrainer`` the rows as they are and the tokenizer (``autotune.runner``); TRL then
renders each conversation with the chat template, tokenizes it, builds the labels of the study's loss and
truncates to ``max_length`` (trl/trainer/sft_trainer.py ``_prepare_dataset``: ``tokenize_fn`` :1314-1400,
the labels :1402-1430, the truncation :1432-1463). A row TRL cannot read, or a template that raises, loops
or explodes, used to end each trial in a traceback, a timeout or a crash. Here the same steps run over
the rows a trial trains on, in TRL's order, and the first fault is one line naming the row (rows count
from 1 in the order of the file):

* the row's shape, as TRL reads it: the format's columns present (a ``messages`` row with no
  conversation is one of rows that mix formats); a conversation a non-empty list of mappings, each with a
  ``role`` (``trl.data_utils.is_conversational`` reads the first message's role and TRL's
  ``apply_chat_template`` the prompt's last; an empty list fails in ``is_conversational``); prompt and
  completion both conversations or both text, as the first row (TRL decides the form from it);
* the chat template over every conversation TRL renders (the row's ``tools`` and
  ``chat_template_kwargs`` passed as TRL passes them), through transformers' own sandboxed renderer,
  bounded: :data:`RENDER_SECONDS` of time and :data:`RENDER_BYTES` of memory per render, and text no
  larger than the row itself by more than :data:`RENDER_EXTRA_CHARS`. A template that raises, does not
  compile, includes a file (the sandbox has no loader), renders nothing, loops too long or builds a huge
  text is refused on the row where it does. What the template accepts is accepted: content blocks,
  ``tool_calls`` with no content, whatever it renders;
* the tokens: under ``--loss-on assistant`` TRL refuses a row the template marks no assistant token in
  (sft_trainer.py:1392-1398), so that row is refused here.

What TRL skips is counted, not refused: a row truncated to ``--seq-len`` tokens with no label left is
dropped by TRL (sft_trainer.py:1455-1463; the child's own truncation does the same, ``autotune.trainers.sft``):
:func:`dropped_rows` says how many, and only data where every row is dropped is refused.

Why the bounds are in-process: a subprocess with a timeout would bound everything but costs a process
start per search (and per test); the render is Python code (Jinja compiles a template to Python), so a
timer thread raises into it (CPython's ``PyThreadState_SetAsyncExc``, delivered between bytecodes as
a signal's exception is, in any thread, with no signal handler to take from pytest-timeout or the
caller) and a soft address-space limit held for the render's length turns a huge allocation into a
``MemoryError``, the limit each trial runs under too (``runner._limits``). The tokenizer's Rust code,
which aborts the process where an allocation fails, runs only after the render passed the bounds.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from autotune.errors import AutotuneError
from autotune.units import GiB, MiB, format_bytes

# One render of one row: a chat template renders a conversation in milliseconds (a loop over its
# messages); a row that takes seconds is a loop that would stall every trial on every row.
RENDER_SECONDS = 5.0
# Memory one render may take beyond what the process holds: a million-token conversation is a few MiB of text.
RENDER_BYTES = 1 * GiB
# Text a template may add to a row beyond twice the row's own (JSON) characters: a system prompt and
# tool schemas are KiB; more is output the template builds for itself.
RENDER_EXTRA_CHARS = 1 * MiB
# The rows a user's run starts with, checked with the sample the trials train on where the data is read.


class RowsReader(Protocol):
    """What :func:`prepare_sft_rows` asks of the trainer that reads the rows (``autotune.trainers.TrainerKind``)."""

    words: str

    def columns_kept(self, data: str, columns: Sequence[str]) -> tuple[str, ...]: ...

    def dropped_rows(
        self,
        rows: Iterable[tuple[int, Mapping[str, Any]]],
        tokenizer: Any,
        data: str,
        seq_len: int,
        loss_on: str,
        path: str,
    ) -> int: ...

    def dropped_rows_note(self, dropped: int, total: int, seq_len: int, loss_on: str, path: str) -> str | None: ...

    def row_lengths(self, rows: Iterable[Mapping[str, Any]], tokenizer: Any, data: str, loss_on: str) -> list[int]: ...


FIRST_ROWS = 100
# TRL's per-row extras it renders with (sft_trainer.py:1315-1320): kept with the rows for the trials too.
ROW_EXTRAS = ("tools", "chat_template_kwargs")


class _PastTime(BaseException):
    """Raised into the rendering thread when a render runs past its time; a BaseException, so no
    ``except Exception`` in Jinja or transformers catches it on its way out."""


class RowFault(Exception):
    """What is wrong with one row (or with the template, found on that row)."""


def check_rows(
    rows: Iterable[tuple[int, Mapping[str, Any]]],
    tokenizer: Any,
    data: str,
    loss_on: str,
    seq_len: int,
    path: str,
    render_seconds: float = RENDER_SECONDS,
    render_bytes: int = RENDER_BYTES,
) -> int:
    """Check ``rows`` as TRL will read them, and count those TRL drops.

    Args:
        rows: (index in the data, row) pairs.
        tokenizer: The tokenizer the trials hand TRL.
        data: The rows' format (``autotune.spec.sft.FORMATS``).
        loss_on: The study's loss (``--loss-on``).
        seq_len: TRL's ``max_length``: a row is truncated to its first ``seq_len`` tokens.
        path: ``--dataset``, for the message.
        render_seconds: Time one render may take.
        render_bytes: Memory one render may take.

    Returns:
        Rows left with no label within ``seq_len`` tokens (TRL drops them).

    Raises:
        AutotuneError: The first row TRL or the chat template fails on, named, with the fault.
    """
    reader = _sft_reader(tokenizer, data, loss_on, render_seconds, render_bytes)
    dropped = 0
    for index, row in rows:
        try:
            trained = reader.trained_tokens(row)
        except RowFault as fault:
            raise AutotuneError(f"--dataset {path}: row {index + 1}: {fault}") from None
        dropped += not any(trained[:seq_len])
    return dropped


def sft_row_lengths(rows: Iterable[Mapping[str, Any]], tokenizer: Any, data: str, loss_on: str) -> list[int]:
    """Each row's tokens as SFTTrainer tokenizes it, before truncation (rows :func:`check_rows` read already)."""
    reader = _sft_reader(tokenizer, data, loss_on, RENDER_SECONDS, RENDER_BYTES)
    return [len(reader.trained_tokens(row)) for row in rows]


def _sft_reader(tokenizer: Any, data: str, loss_on: str, render_seconds: float, render_bytes: int) -> _RowReader:
    """The row reader of SFTTrainer's tokenization, with TRL's template: the tokenizer's own, or its training
    one under assistant loss (sft_trainer.py:941-944)."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    template = None
    if data != "text" and loss_on == "assistant" and not has_generation_markers(tokenizer.chat_template):
        template = get_training_chat_template(tokenizer)
    return _RowReader(tokenizer, data, loss_on, template, render_seconds, render_bytes)


def dropped_rows_note(dropped: int, total: int, seq_len: int, loss_on: str, path: str) -> str | None:
    """The note of the rows TRL drops, ``None`` for none.

    Raises:
        AutotuneError: Every row is dropped: a trial would have nothing to train on.
    """
    words = {"all": "a token", "completion": "a completion token", "assistant": "an assistant token"}[loss_on]
    if dropped == total:
        raise AutotuneError(
            f"--dataset {path}: no row has {words} to train on within its first {seq_len} tokens (TRL keeps the "
            "first --seq-len tokens and drops a row left without a label): raise --seq-len, or shorten what comes before"
        )
    if not dropped:
        return None
    return (
        f"TRL drops {dropped} of the {total} rows the trials train on: not {words} within their first {seq_len} "
        "tokens (--seq-len; TRL drops a row truncation leaves without a label, and so will your run)"
    )


def chat_tokens(
    row: Mapping[str, Any],
    messages: list[Any],
    tokenizer: Any,
    render_seconds: float = RENDER_SECONDS,
    render_bytes: int = RENDER_BYTES,
    **options: Any,
) -> list[int]:
    """``messages`` of ``row`` rendered and tokenized as TRL does (the row's ``tools`` and
    ``chat_template_kwargs`` passed on), through the same bounded render as every row here: for a trainer
    that reads conversations beside SFTTrainer's (DPOTrainer's prompt: ``add_generation_prompt=True``).

    Raises:
        RowFault: What the row or the chat template fails on.
    """
    reader = _RowReader(tokenizer, "conversations", "all", None, render_seconds, render_bytes)
    return list(reader._chat(row, messages, **options)["input_ids"])


class _RowReader:
    """One row through TRL's steps: its shape, the renders, the tokens it trains on."""

    def __init__(
        self, tokenizer: Any, data: str, loss_on: str, template: str | None, seconds: float, memory: int
    ) -> None:
        self.tokenizer, self.data, self.loss_on, self.template = tokenizer, data, loss_on, template
        self.seconds, self.memory = seconds, memory
        self.first_form: str | None = None  # prompt/completion: the form of the first row read

    def trained_tokens(self, row: Mapping[str, Any]) -> list[bool]:
        """Whether each token of the row carries a label under the study's loss.

        Raises:
            RowFault: What TRL or the chat template fails on.
        """
        if self.data == "text":
            text = _required(row, "text")
            if not isinstance(text, str):
                raise RowFault(f"text is {_kind(text)}, not a string")
            return [True] * len(self.tokenizer(text=_with_eos(text, self.tokenizer.eos_token))["input_ids"])
        if self.data == "messages":
            tokens = self._chat(row, _conversation(row, "messages"), return_assistant_tokens_mask=self._assistant)
            return self._masked(tokens, [True] * len(tokens["input_ids"]))
        prompt, completion = _required(row, "prompt"), _required(row, "completion")
        form = self._pair_form(prompt, completion)
        if form == "text":  # TRL adds the end-of-sequence token to a text completion (sft_trainer.py:1283-1298)
            completion = _with_eos(completion, self.tokenizer.eos_token)
            prompt_ids = self.tokenizer(text=prompt)["input_ids"]
            full: Mapping[str, Any] = {"input_ids": self.tokenizer(text=prompt + completion)["input_ids"]}
        else:
            prompt, completion = _conversation(row, "prompt"), _conversation(row, "completion")
            prompt_ids = self._chat(row, prompt, add_generation_prompt=True)["input_ids"]
            full = self._chat(row, prompt + completion, return_assistant_tokens_mask=self._assistant)
        # TRL's completion mask: the completion starts where prompt and prompt+completion diverge (:1352-1371)
        ids = full["input_ids"]
        start = next((i for i, (a, b) in enumerate(zip(prompt_ids, ids)) if a != b), min(len(prompt_ids), len(ids)))
        completion_mask = [i >= start for i in range(len(ids))]
        return self._masked(full, completion_mask if self.loss_on == "completion" else [True] * len(ids))

    @property
    def _assistant(self) -> bool:
        return self.loss_on == "assistant"

    def _masked(self, tokens: Mapping[str, Any], trained: list[bool]) -> list[bool]:
        """The labels TRL builds: the assistant mask where it asked for one, with ``trained`` (:1402-1430)."""
        if not self._assistant:
            return trained
        mask = tokens.get("assistant_masks") or []
        if 1 not in mask:
            raise RowFault(
                "no assistant token (no assistant turn, or one the chat template does not mark); TRL refuses "
                "such a row under --loss-on assistant: give it an assistant turn, or use --loss-on all"
            )
        return [bool(bit) and keep for bit, keep in zip(mask, trained)]

    def _pair_form(self, prompt: Any, completion: Any) -> str:
        """``conversations`` or ``text``: both the same, and the same as the first row's."""
        forms = {_form(prompt), _form(completion)}
        if len(forms) != 1 or None in forms:
            raise RowFault(
                f"prompt is {_kind(prompt)} and completion {_kind(completion)}: give both as lists of messages "
                "or both as text"
            )
        form = forms.pop()
        assert form is not None
        if self.first_form is None:
            self.first_form = form
        elif self.first_form != form:
            raise RowFault(
                f"prompt and completion are {form} where the first row's are {self.first_form}: TRL reads "
                "every row in the first row's form; give one form"
            )
        return form

    def _chat(self, row: Mapping[str, Any], messages: list[Any], **options: Any) -> Mapping[str, Any]:
        """The conversation through TRL's ``_tokenize`` (trl/data_utils.py): rendered once within the bounds,
        then rendered and tokenized as TRL does."""
        tools = row.get("tools")
        extra = row.get("chat_template_kwargs", {})
        if extra is None or not isinstance(extra, Mapping):
            raise RowFault(f"chat_template_kwargs is {_kind(extra)}, not a mapping (TRL passes it on as keywords)")
        try:
            tools = json.loads(tools) if isinstance(tools, str) else tools
        except ValueError as exc:
            raise RowFault(f"tools is not JSON ({exc})") from None
        arguments = {"chat_template": self.template, "tools": tools, **extra}
        render = {k: v for k, v in options.items() if k != "return_assistant_tokens_mask"}
        text = self._bounded_render(messages, {**arguments, **render})
        row_chars = len(json.dumps(dict(row), ensure_ascii=False, default=str))  # tool schemas included
        if len(text) > 2 * row_chars + RENDER_EXTRA_CHARS:
            raise RowFault(
                f"the chat template renders {len(text):,} characters for it, far more than the row holds "
                f"({row_chars:,}): a template that builds text of its own would exhaust every trial's memory"
            )
        if not text.strip():
            raise RowFault("the chat template renders it to no text: fix the template")
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, **arguments, **options)
        except Exception as exc:  # noqa: BLE001 - whatever fails here fails in every trial
            raise RowFault(f"TRL cannot tokenize it ({_said(exc)})") from None

    def _bounded_render(self, messages: list[Any], arguments: Mapping[str, Any]) -> str:
        import jinja2

        try:
            with _bounded(self.seconds, self.memory):
                text = self.tokenizer.apply_chat_template(messages, tokenize=False, **arguments)
        except _PastTime:
            raise RowFault(
                f"the chat template ran {self.seconds:g} s on it without finishing: a loop that would stall every "
                "trial; fix the template"
            ) from None
        except MemoryError:
            raise RowFault(
                f"the chat template needed more than {format_bytes(self.memory)} of memory on it: a template that "
                "builds text of its own; fix the template"
            ) from None
        except jinja2.TemplateSyntaxError as exc:
            raise RowFault(f"the chat template does not compile (line {exc.lineno}: {exc.message})") from None
        except Exception as exc:  # noqa: BLE001 - a template may raise anything; the trial would fail on it
            raise RowFault(f"the chat template fails on it ({_said(exc)}): fix the row or the template") from None
        return str(text)


def _required(row: Mapping[str, Any], column: str) -> Any:
    value = row.get(column)
    if value is None:
        raise RowFault(
            f"{column} is empty (null): every row needs one (do the rows mix formats? give every row the same columns)"
        )
    return value


def _conversation(row: Mapping[str, Any], column: str) -> list[Any]:
    """``row[column]`` as TRL reads a conversation: a non-empty list of mappings with a role."""
    value = _required(row, column)
    if not isinstance(value, list):
        raise RowFault(f"{column} is {_kind(value)}, not a list of messages ({{'role': ..., 'content': ...}})")
    if not value:
        raise RowFault(f"{column} is an empty conversation: give it at least one message")
    for number, message in enumerate(value, start=1):
        if not isinstance(message, Mapping):
            raise RowFault(f"{column} message {number} is {_kind(message)}, not a {{'role': ..., 'content': ...}}")
        if not isinstance(message.get("role"), str):
            raise RowFault(f"{column} message {number} has no role (a string: system, user, assistant, tool)")
    return value


def _with_eos(text: str, eos: str | None) -> str:
    """TRL's ``add_eos`` (sft_trainer.py:1283-1298): the end-of-sequence token appended unless already there."""
    return text if not eos or text.endswith(eos) else text + eos


def _form(value: Any) -> str | None:
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "conversations"
    return None


def _kind(value: Any) -> str:
    """A value's type and its start, for a message: ``an int (3)``."""
    if value is None:
        return "null"
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name} ({repr(value)[:40]})"


def _said(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


@contextlib.contextmanager
def _bounded(seconds: float, memory: int) -> Iterator[None]:
    """Run the block in this thread for ``seconds`` at most (:class:`_PastTime` raised into it), and
    with ``memory`` bytes of address space beyond what the process holds (``MemoryError`` past it)."""
    thread = threading.get_ident()
    lock = threading.Lock()
    finished = False

    def interrupt() -> None:
        with lock:
            if not finished:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), ctypes.py_object(_PastTime))

    timer = threading.Timer(seconds, interrupt)
    timer.daemon = True
    timer.start()
    try:
        with _address_space_within(memory):
            yield
    finally:
        with lock:
            finished = True
            # One raised too late to land in the block is withdrawn: the block is over.
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), None)
        timer.cancel()


@contextlib.contextmanager
def _address_space_within(memory: int) -> Iterator[None]:
    """The process's soft ``RLIMIT_AS`` lowered to what it maps now plus ``memory``, for the block's
    length (where ``/proc/self/statm`` says what it maps: Linux); an allocation past it is a ``MemoryError``."""
    import os
    import resource

    try:
        with open("/proc/self/statm") as statm:
            mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    bound = mapped + memory if hard == resource.RLIM_INFINITY else min(mapped + memory, hard)
    if soft != resource.RLIM_INFINITY and soft <= bound:
        yield
        return
    resource.setrlimit(resource.RLIMIT_AS, (bound, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
