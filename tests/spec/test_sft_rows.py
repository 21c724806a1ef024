"""SFT rows checked as TRL reads them, before any trial (autotune/spec/sft_rows.py; issue 38, section 6).

Every input of the issue's table, which used to cost the seed trial (a traceback, a timeout, a crash),
is one line naming the row and the fault here, through the real tokenizer (the synthetic one, with its
ChatML template or a template of the test's) and transformers' own sandboxed renderer; what TRL and
the template accept (tool calls the template renders, content blocks) is accepted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autotune.errors import AutotuneError
from autotune.spec.sft_rows import check_rows, dropped_rows_note
from tests.support.cli import run_cli_in_process

USER = {"role": "user", "content": "ba be"}
ASSISTANT = {"role": "assistant", "content": "bi bo"}
GOOD = {"messages": [USER, ASSISTANT]}
TOOL_CALL = {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]}
# A template that renders tool calls (as Qwen's and Llama's do), and plain content otherwise.
TOOL_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}{{ c.function.name }}{% endfor %}"
    "{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from autotune.spec.synthetic_tokenizer import build_tokenizer

    return build_tokenizer(4096)


def _check(tokenizer: Any, rows: list[dict[str, Any]], data: str = "messages", loss_on: str = "all", **bounds: Any):
    return check_rows(enumerate(rows), tokenizer, data, loss_on, 64, "chat.jsonl", **bounds)


@pytest.mark.parametrize(
    ("rows", "data", "loss_on", "fault"),
    [
        ([GOOD, {"messages": [USER, {"content": "bi"}]}], "messages", "all", "row 2: messages message 2 has no role"),
        (
            [{"messages": [USER, {"role": "assistant", "content": 5}]}],
            "messages",
            "all",
            "row 1: the chat template fails",
        ),
        ([{"messages": [USER, {"role": "assistant", "content": ["a"]}]}], "messages", "all", "TypeError"),
        ([{"messages": [USER, {"role": "assistant", "content": None}]}], "messages", "all", "UndefinedError"),
        ([{"messages": [USER, TOOL_CALL]}], "messages", "all", "row 1: the chat template fails on it (UndefinedError"),
        ([GOOD, {"messages": []}], "messages", "all", "row 2: messages is an empty conversation"),
        ([GOOD, {"messages": None, "text": "ba"}], "messages", "all", "row 2: messages is empty (null)"),
        ([{"messages": "ba be"}], "messages", "all", "row 1: messages is a str ('ba be'), not a list of messages"),
        ([GOOD, {"messages": [USER]}], "messages", "assistant", "row 2: no assistant token"),
        ([{"text": 3}], "text", "all", "row 1: text is an int (3), not a string"),
        (
            [{"prompt": [USER], "completion": "bi"}],
            "prompt-completion",
            "completion",
            "row 1: prompt is a list",
        ),
        (
            [{"prompt": [USER], "completion": [ASSISTANT]}, {"prompt": "ba", "completion": "bi"}],
            "prompt-completion",
            "completion",
            "row 2: prompt and completion are text where the first row's are conversations",
        ),
        ([{"messages": [USER, ASSISTANT], "chat_template_kwargs": None}], "messages", "all", "chat_template_kwargs"),
    ],
    ids=[
        "a missing role",
        "an int content",
        "a list content",
        "a null content",
        "tool_calls the template cannot render",
        "an empty conversation",
        "messages and text rows mixed",
        "messages as a string",
        "no assistant turn under --loss-on assistant",
        "text not a string",
        "prompt a conversation, completion text",
        "rows of two forms",
        "null chat_template_kwargs",
    ],
)
def test_a_row_trl_cannot_read_is_one_line_naming_it(tokenizer, rows, data, loss_on, fault):
    with pytest.raises(AutotuneError, match="^--dataset chat.jsonl: ") as raised:
        _check(tokenizer, rows, data, loss_on)
    assert fault in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("template", "fault"),
    [
        ("{{ raise_exception('no system turn allowed') }}", "fails on it (TemplateError: no system turn allowed)"),
        ("{% for m in messages %}{{ m.content }", "the chat template does not compile (line 1:"),
        ("{% include 'other.jinja' %}", "the chat template fails on it (TypeError: no loader"),
        ("{% for m in messages %}{% endfor %}", "renders it to no text"),
        (
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "ran 0.5 s on it without finishing",
        ),
        (
            "{% for i in range(1000) %}{{ messages[0].content * 2000 }}{% endfor %}",
            f"renders {1000 * 2000 * len(USER['content']):,} characters",
        ),
        ("{{ 'x' * 1000000000 }}", "needed more than 64.00 MiB of memory"),
    ],
    ids=[
        "raises",
        "a syntax error",
        "includes",
        "renders nothing",
        "a huge nested loop",
        "huge output",
        "a huge string",
    ],
)
def test_a_template_that_fails_loops_or_explodes_is_one_line_before_any_trial(tokenizer, template, fault):
    import resource

    limit = resource.getrlimit(resource.RLIMIT_AS)
    tokenizer.chat_template = template
    with pytest.raises(AutotuneError, match="^--dataset chat.jsonl: row 1: ") as raised:
        _check(tokenizer, [GOOD], render_seconds=0.5, render_bytes=64 * 1024**2)
    assert fault in str(raised.value)
    assert resource.getrlimit(resource.RLIMIT_AS) == limit  # the memory bound held for the render only
    from autotune.spec.chat_corpus import CHATML_TEMPLATE

    tokenizer.chat_template = CHATML_TEMPLATE  # the module's tokenizer, as it was


def test_what_trl_and_the_template_accept_is_accepted(tokenizer):
    """Tool calls a template renders, and the rows of every format and loss the corpus writes."""
    from autotune.spec.chat_corpus import CHATML_TEMPLATE, as_format, conversations

    tokenizer.chat_template = TOOL_TEMPLATE
    assert _check(tokenizer, [{"messages": [USER, TOOL_CALL, {"role": "tool", "content": "ok"}, ASSISTANT]}]) == 0
    tokenizer.chat_template = CHATML_TEMPLATE
    chats = list(conversations(20, seed=0))
    for data, losses in {
        "messages": ("all", "assistant"),
        "prompt-completion": ("completion", "all"),
        "text": ("all",),
    }.items():
        for loss_on in losses:
            rows = [as_format(messages, data) for messages in chats]
            assert check_rows(enumerate(rows), tokenizer, data, loss_on, 100_000, "chat.jsonl") == 0


def test_rows_truncation_leaves_without_a_label_are_counted_and_all_of_them_refused(tokenizer):
    """TRL keeps a row's first max_length tokens and drops a row left without a label: a count, a note;
    every row dropped is a trial with nothing to train on."""
    long_user = {"role": "user", "content": " ".join(["ba"] * 80)}  # past --seq-len 64 before the assistant speaks
    rows = [GOOD, {"messages": [long_user, ASSISTANT]}]
    dropped = _check(tokenizer, rows, loss_on="assistant")
    assert dropped == 1
    note = dropped_rows_note(dropped, len(rows), 64, "assistant", "chat.jsonl")
    assert note is not None and note.startswith("TRL drops 1 of the 2 rows")
    assert _check(tokenizer, rows, loss_on="all") == 0  # every token is trained: nothing dropped
    with pytest.raises(AutotuneError, match="no row has an assistant token to train on within its first 64 tokens"):
        dropped_rows_note(_check(tokenizer, rows[1:], loss_on="assistant"), 1, 64, "assistant", "chat.jsonl")


def _chat_rows(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_a_search_on_a_bad_row_is_one_line_naming_it_before_any_trial(tmp_path):
    """The real command line, in this process: the row's fault is the whole answer, exit 2, no trial."""
    from tests.support.bad_input import SEARCH, assert_one_error_line

    rows = [GOOD] * 40 + [{"messages": [USER, {"content": "bi"}]}] + [GOOD] * 40
    dataset = _chat_rows(tmp_path / "chat.jsonl", rows)
    completed = run_cli_in_process(
        *SEARCH,
        *("--model", "llama-tiny", "--dataset", dataset, "--max-global-batch", "8", "--storage", "sqlite:///cases.db"),
        cwd=tmp_path,
    )
    assert_one_error_line(completed, f"--dataset {dataset}: row 41: messages message 2 has no role")
    assert not list(tmp_path.glob("autotune_runs/trial-*"))
    assert not (tmp_path / "cases.db").exists()


def test_a_search_notes_the_rows_trl_drops_and_keeps_the_rows_tool_schemas(tmp_path):
    """Through the parent's preparation: the count is a note, and TRL's per-row ``tools`` stay with the rows."""
    from autotune.spec.dataset import prepare_sft_rows
    from autotune.spec.models import resolve_model
    from autotune.trainers import get, with_model

    long_user = {"role": "user", "content": " ".join(["ba"] * 80)}
    rows = [{**GOOD, "tools": "[]"}] * 12 + [{"messages": [long_user, ASSISTANT], "tools": "[]"}] * 4
    notes: list[str] = []
    model = with_model(resolve_model("llama-tiny"), get("sft"))
    dataset = _chat_rows(tmp_path / "chat.jsonl", rows)
    prepared = prepare_sft_rows(
        dataset, model, "messages", "assistant", 8, 2, str(tmp_path / "cache"), notes, 64, get("sft")
    )
    assert [note for note in notes if note.startswith("TRL drops")] == [
        "TRL drops 4 of the 16 rows the trials train on: not an assistant token within their first 64 tokens "
        "(--seq-len; TRL drops a row truncation leaves without a label, and so will your run)"
    ]
    assert prepared.num_samples == 12  # one epoch of the user's run trains the rows TRL keeps: its projected time too
    from datasets import load_from_disk

    assert load_from_disk(prepared.prepared_dir).column_names == ["messages", "tools"]
