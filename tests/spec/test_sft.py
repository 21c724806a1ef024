"""The SFT loss of a study (autotune/spec/sft.py): chosen from the rows, fixed for the study, every
contradiction refused in one line. (The trainer's choice: tests/trainers/test_trainers.py.)"""

from __future__ import annotations

import pytest

from autotune.errors import AutotuneError
from autotune.spec.sft import (
    check_chat_template,
    default_loss_on,
    loss_on_arguments,
    resolve_loss_on,
    sft_arguments,
    trains_untruncated,
)

CHAT_ROW = {"messages": [{"role": "user", "content": "ba"}, {"role": "assistant", "content": "be"}]}
PAIR_ROW = {"prompt": [{"role": "user", "content": "ba"}], "completion": [{"role": "assistant", "content": "be"}]}
TEXT_ROW = {"text": "ba be"}


def test_the_loss_defaults_to_trls_own_choice_and_is_written_whole():
    assert default_loss_on("prompt-completion") == "completion"  # completion_only_loss=None on such rows
    assert default_loss_on("messages") == default_loss_on("text") == "all"
    assert resolve_loss_on(None, {}, "prompt-completion", PAIR_ROW) == "completion"
    assert resolve_loss_on(None, {"assistant_only_loss": True}, "messages", CHAT_ROW) == "assistant"
    assert resolve_loss_on(None, {"completion_only_loss": False}, "prompt-completion", PAIR_ROW) == "all"
    assert loss_on_arguments("assistant") == {"completion_only_loss": False, "assistant_only_loss": True}
    assert loss_on_arguments("all") == {"completion_only_loss": False, "assistant_only_loss": False}


@pytest.mark.parametrize(
    ("option", "base_args", "data", "row", "message"),
    [
        ("all", {"assistant_only_loss": True}, "messages", CHAT_ROW, "--loss-on all contradicts --base-args"),
        (
            None,
            {"assistant_only_loss": True, "completion_only_loss": True},
            "prompt-completion",
            PAIR_ROW,
            "both on: keep one",
        ),
        ("completion", {}, "messages", CHAT_ROW, "--loss-on completion needs prompt and completion columns"),
        ("assistant", {}, "text", TEXT_ROW, "--loss-on assistant needs conversations"),
        ("tokens", {}, "messages", CHAT_ROW, "--loss-on tokens: choose one of all, completion, assistant"),
    ],
)
def test_a_loss_the_rows_or_the_arguments_contradict_is_refused(option, base_args, data, row, message):
    with pytest.raises(AutotuneError, match=message):
        resolve_loss_on(option, base_args, data, row)


def test_the_chat_template_must_render_the_rows_and_mark_the_assistant():
    from transformers import PreTrainedTokenizerFast

    from autotune.spec.synthetic_tokenizer import build_tokenizer

    tokenizer = build_tokenizer(32000)
    check_chat_template(tokenizer, "assistant", "messages")  # its ChatML template has {% generation %}
    bare = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, eos_token="<|im_end|>")
    with pytest.raises(AutotuneError, match="the tokenizer has no chat_template to render them"):
        check_chat_template(bare, "all", "messages")
    check_chat_template(bare, "all", "text")  # text rows need no template
    bare.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"  # no markers, unknown to TRL
    with pytest.raises(AutotuneError, match="TRL cannot mark the assistant's tokens in this chat template"):
        check_chat_template(bare, "assistant", "messages")


def test_max_length_is_the_sequence_length_unless_a_lever_asks_for_none():
    assert sft_arguments({"bf16": True}, 256, "all") == {
        "bf16": True,
        "completion_only_loss": False,
        "assistant_only_loss": False,
        "max_length": 256,
    }
    untruncated = sft_arguments({"padding_free": True, "max_length": None}, 256, "assistant")
    assert untruncated["max_length"] is None and untruncated["assistant_only_loss"] is True
    assert trains_untruncated(untruncated) and not trains_untruncated(sft_arguments({}, 256, "all"))
