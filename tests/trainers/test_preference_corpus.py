"""The generated preference pairs (autotune/trainers/_preference_corpus.py): their structure, their determinism,
their token count as the synthetic tokenizer and TRL's collator count it, their written forms and the
command line (``chat-corpus --format preference``)."""

from __future__ import annotations

import json
import statistics

import pytest

from autotune.spec.chat_corpus import DEFAULT_SHAPE, IM_END, conversation, render_chatml
from autotune.spec.synthetic_tokenizer import build_tokenizer
from autotune.trainers import write_corpus
from autotune.trainers._preference_corpus import (
    PREFERENCE_FORMATS,
    as_preference_row,
    pair_tokens,
    preference_pair,
    preference_rows,
)
from tests.support.cli import run_cli_in_process


def test_the_prompt_and_the_chosen_answer_are_the_chat_corpus_conversation():
    for index in range(50):
        prompt, chosen, rejected = preference_pair(index, seed=4)
        assert [*prompt, chosen] == conversation(index, seed=4)
        assert prompt[-1]["role"] == "user"
        assert chosen["role"] == rejected["role"] == "assistant"


def test_the_same_seed_gives_the_same_pairs_and_another_seed_others():
    assert preference_rows(20, seed=1) == preference_rows(20, seed=1)
    assert preference_rows(20, seed=1)[:5] == preference_rows(5, seed=1)  # a larger corpus starts with the smaller
    assert preference_rows(20, seed=1) != preference_rows(20, seed=2)


def test_rejected_answers_are_drawn_apart_from_the_chosen_at_the_same_lengths():
    pairs = [preference_pair(index) for index in range(2000)]
    chosen = [len(c["content"].split()) for _, c, _ in pairs]
    rejected = [len(r["content"].split()) for _, _, r in pairs]
    assert sum(c == r for c, r in zip(chosen, rejected)) < 0.05 * len(pairs)  # independent draws
    median = DEFAULT_SHAPE.assistant.median
    assert 0.85 * median <= statistics.median(rejected) <= 1.15 * median
    assert 0.85 <= statistics.median(rejected) / statistics.median(chosen) <= 1.15


def test_pair_tokens_are_what_the_synthetic_tokenizer_gives_prompt_plus_each_answer():
    """TRL's collator forwards prompt + chosen and prompt + rejected (trl/trainer/dpo_trainer.py,
    ``DataCollatorForPreference``): both token counts together are what a pair costs."""
    tokenizer = build_tokenizer(9000)
    for index in range(10):
        prompt, chosen, rejected = preference_pair(index, shape=DEFAULT_SHAPE.scaled(0.25))
        counted = sum(
            len(tokenizer.apply_chat_template([*prompt, answer], tokenize=True, return_dict=True)["input_ids"])
            for answer in (chosen, rejected)
        )
        assert pair_tokens(prompt, chosen, rejected) == counted


def test_the_text_form_is_the_chatml_prompt_up_to_the_assistant_header():
    prompt, chosen, rejected = preference_pair(3)
    row = as_preference_row(prompt, chosen, rejected, "preference-text")
    assert row["prompt"].endswith("<|im_start|>assistant\n")
    # TRL appends the EOS token (<|im_end|> under the synthetic tokenizer) to a plain answer.
    assert row["prompt"] + row["chosen"] + IM_END + "\n" == render_chatml([*prompt, chosen])
    assert row["rejected"] == rejected["content"]


def test_the_chat_form_is_trl_conversational_preference():
    prompt, chosen, rejected = preference_pair(3)
    assert as_preference_row(prompt, chosen, rejected, "preference") == {
        "prompt": prompt,
        "chosen": [chosen],
        "rejected": [rejected],
    }


@pytest.mark.parametrize("fmt", PREFERENCE_FORMATS)
def test_write_corpus_writes_one_pair_a_line(tmp_path, fmt):
    out = tmp_path / "pairs.jsonl"
    total = write_corpus(str(out), 15, seed=2, fmt=fmt, length_scale=0.5)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == preference_rows(15, seed=2, fmt=fmt, length_scale=0.5)
    shape = DEFAULT_SHAPE.scaled(0.5)
    assert total == sum(pair_tokens(*preference_pair(index, 2, shape)) for index in range(15))


def test_the_command_writes_preference_pairs(tmp_path):
    result = run_cli_in_process(
        "chat-corpus", "--out", "pairs.jsonl", "--samples", "8", "--format", "preference", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "wrote pairs.jsonl: 8 preference pairs (preference)" in result.stdout
    rows = [json.loads(line) for line in (tmp_path / "pairs.jsonl").read_text().splitlines()]
    assert rows == preference_rows(8)
