"""The generated chat corpus (autotune/spec/chat_corpus.py): its length statistics, its
determinism per seed, its conversation structure, its written forms and its command line."""

from __future__ import annotations

import json
import statistics

import pytest

from autotune.errors import AutotuneError
from autotune.spec.chat_corpus import (
    DEFAULT_SHAPE,
    FORMATS,
    LENGTH_SCALES,
    MAX_TURN_TOKENS,
    as_format,
    conversation,
    conversation_tokens,
    conversations,
    lexicon,
    write_jsonl,
)
from tests.support.cli import run_cli_in_process

SAMPLES = 3000


@pytest.fixture(scope="module")
def corpus() -> list[list[dict[str, str]]]:
    return list(conversations(SAMPLES, seed=0))


@pytest.fixture(scope="module")
def lengths(corpus) -> list[int]:
    return [conversation_tokens(messages) for messages in corpus]


def share_past(lengths: list[int], seq_len: int) -> float:
    return sum(length > seq_len for length in lengths) / len(lengths)


def test_lengths_are_right_skewed_as_in_public_chat_data(lengths):
    """The module docstring's figures (200,000 draws: median 516, mean 695, 21 % past 1024, 3.5 %
    past 2048), within what 3,000 conversations leave of them."""
    median, mean = statistics.median(lengths), statistics.fmean(lengths)
    assert 440 <= median <= 600
    assert 1.2 <= mean / median <= 1.5  # log-normal skew; the Nemotron SFT data has 1.34
    assert 0.16 <= share_past(lengths, 1024) <= 0.27
    assert 0.015 <= share_past(lengths, 2048) <= 0.06  # a long tail past TRL's default max_length and beyond
    assert share_past(lengths, 256) > 0.7


def test_length_scale_shrinks_the_medians_and_keeps_the_spread(lengths):
    scaled = [conversation_tokens(m) for m in conversations(SAMPLES, seed=0, shape=DEFAULT_SHAPE.scaled(0.25))]
    assert 0.2 <= statistics.median(scaled) / statistics.median(lengths) <= 0.32
    # The same shape at a quarter of the scale: the share past 256 tokens is about the share past 1024.
    assert abs(share_past(scaled, 256) - share_past(lengths, 1024)) < 0.06


def test_past_either_end_of_the_length_scales_every_median_is_at_a_bound():
    """--length-scale accepts LENGTH_SCALES (autotune.plan checks it): past them a scale changes nothing."""
    low, high = (DEFAULT_SHAPE.scaled(scale) for scale in LENGTH_SCALES)
    assert max(shape.median for shape in (low.system, low.user, low.assistant)) == pytest.approx(1)
    assert max(shape.median for shape in (high.system, high.user, high.assistant)) == pytest.approx(MAX_TURN_TOKENS)


def test_the_same_seed_gives_the_same_corpus_and_another_seed_another():
    first = list(conversations(50, seed=7))
    assert list(conversations(50, seed=7)) == first
    assert list(conversations(50, seed=8)) != first
    # Conversation i depends only on (seed, i): a larger corpus starts with the smaller one.
    assert list(conversations(80, seed=7))[:50] == first
    assert conversation(49, seed=7) == first[49]


def test_conversations_are_multi_turn_chat(corpus):
    rounds = []
    for messages in corpus:
        roles = [m["role"] for m in messages]
        if roles[0] == "system":
            roles = roles[1:]
        assert roles and len(roles) % 2 == 0
        assert roles[0::2] == ["user"] * (len(roles) // 2)
        assert roles[1::2] == ["assistant"] * (len(roles) // 2)
        assert all(m["content"] and m["content"] == m["content"].strip() for m in messages)
        rounds.append(len(roles) // 2)
    assert min(rounds) == 1 and max(rounds) == DEFAULT_SHAPE.max_rounds
    assert 0.4 <= rounds.count(1) / len(rounds) <= 0.6  # another round with probability 0.5
    system_share = sum(m[0]["role"] == "system" for m in corpus) / len(corpus)
    assert 0.2 <= system_share <= 0.3


def test_words_come_from_the_lexicon_most_frequent_first(corpus):
    words = lexicon()
    assert len(set(words)) == len(words)
    counts: dict[str, int] = {}
    for messages in corpus[:200]:
        for message in messages:
            for word in message["content"].split():
                counts[word] = counts.get(word, 0) + 1
    assert set(counts) <= set(words)
    assert counts[words[0]] > counts.get(words[100], 0) > counts.get(words[5000], 0)  # Zipf


def test_prompt_completion_splits_off_the_last_assistant_turn(corpus):
    for messages in corpus[:100]:
        row = as_format(messages, "prompt-completion")
        assert row["prompt"][-1]["role"] == "user"
        assert row["completion"] == [messages[-1]] and messages[-1]["role"] == "assistant"
        assert row["prompt"] + row["completion"] == messages


def test_text_is_the_conversation_in_chatml(corpus):
    text = as_format(corpus[0], "text")["text"]
    for message in corpus[0]:
        assert f"<|im_start|>{message['role']}\n{message['content']}<|im_end|>" in text
    with pytest.raises(AutotuneError, match="--format 'json'"):
        as_format(corpus[0], "json")


@pytest.mark.parametrize("fmt", FORMATS)
def test_write_jsonl_writes_one_row_a_line(tmp_path, fmt):
    out = tmp_path / "chat.jsonl"
    total = write_jsonl(str(out), 20, seed=3, fmt=fmt, length_scale=0.5)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    expected = list(conversations(20, seed=3, shape=DEFAULT_SHAPE.scaled(0.5)))
    assert rows == [as_format(m, fmt) for m in expected]
    assert total == sum(conversation_tokens(m) for m in expected)


def test_the_command_writes_the_corpus(tmp_path):
    result = run_cli_in_process(
        "chat-corpus",
        "--out",
        "chat.jsonl",
        "--samples",
        "12",
        "--seed",
        "5",
        "--format",
        "prompt-completion",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "wrote chat.jsonl: 12 conversations (prompt-completion)" in result.stdout
    rows = [json.loads(line) for line in (tmp_path / "chat.jsonl").read_text().splitlines()]
    assert rows == [as_format(m, "prompt-completion") for m in conversations(12, seed=5)]


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["--samples", "0"], "--samples 0: give a whole number above 0, up to and including 1,000,000"),
        (
            ["--samples", "100000000000000"],
            "--samples 100000000000000: give a whole number above 0, up to and including 1,000,000",
        ),
        (["--samples", "3", "--format", "csv"], "--format 'csv' is not known"),
        (["--samples", "3", "--length-scale", "-1"], "--length-scale -1.0: give a number from 0.005"),
        (["--samples", "3", "--out", "missing/dir/chat.jsonl"], "cannot write it"),
    ],
)
def test_bad_input_is_one_line(tmp_path, args, phrase):
    out = [] if "--out" in args else ["--out", "chat.jsonl"]
    result = run_cli_in_process("chat-corpus", *out, *args, cwd=tmp_path)
    assert result.returncode == 2
    assert phrase in result.stderr and "Traceback" not in result.stderr


def test_an_existing_file_is_replaced_only_with_force(tmp_path):
    (tmp_path / "chat.jsonl").write_text("the user's data\n")
    refused = run_cli_in_process("chat-corpus", "--out", "chat.jsonl", "--samples", "3", cwd=tmp_path)
    assert refused.returncode == 2 and "pass --force to replace it" in refused.stderr
    assert (tmp_path / "chat.jsonl").read_text() == "the user's data\n"
    forced = run_cli_in_process("chat-corpus", "--out", "chat.jsonl", "--samples", "3", "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert len((tmp_path / "chat.jsonl").read_text().splitlines()) == 3


@pytest.mark.slow  # mounts a real tmpfs
def test_a_corpus_larger_than_the_free_space_is_refused_before_writing(tmp_path):
    """On a 1 MiB file system, 100,000 conversations (some 300 MB) are refused in one line, nothing written.
    (Whatever still fails while writing leaves no partial file: tests/spec/test_files.py, and the report on a
    full disk in tests/test_bad_state.py, through the same Destination.)"""
    from tests.support.bad_input import assert_one_error_line
    from tests.support.filesystems import tmpfs

    with tmpfs(tmp_path / "small", "1m") as mount:
        refused = run_cli_in_process("chat-corpus", "--out", "chat.jsonl", "--samples", "100000", cwd=mount)
        assert_one_error_line(refused, "--samples 100000: the corpus would take about")
        assert list(mount.iterdir()) == []
