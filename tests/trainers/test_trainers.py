"""The registry of trainers (autotune/trainers/__init__.py): chosen from the rows unless named, each
trainer what it says it is, every refusal one line."""

from __future__ import annotations

import dataclasses

import pytest

from autotune import trainers
from autotune.errors import AutotuneError
from autotune.trainers import choose, get
from autotune.trainers.sft import SFT


def test_each_trainer_answers_the_protocol():
    """Every attribute and method the Protocol names, on every registered trainer (mypy checks the
    types where a trainer is assigned to ``TrainerKind``; this catches a trainer left out of typing)."""
    wanted = [name for name in trainers.TrainerKind.__annotations__] + [
        name for name, value in vars(trainers.TrainerKind).items() if callable(value) and not name.startswith("_")
    ]
    for kind in trainers.REGISTERED:
        missing = [name for name in wanted if not hasattr(kind, name)]
        assert missing == [], f"{kind.name} lacks {missing}"
        assert set(kind.exported_as) >= {"json", "cli", "python", *kind.tool_forms}


def test_a_trainer_with_tools_forms_says_what_each_holds():
    """A trainer with the tools' forms has their ``tool_export`` (and one without, none): a ``trl`` subcommand
    TRL has, the words of its ``trl`` form naming it, and each YAML tool's keys."""
    import importlib.util

    for kind in trainers.REGISTERED:
        assert (kind.tool_export is None) is (not kind.tool_forms), kind.name
        if kind.tool_export is None:
            continue
        command = kind.tool_export.trl_command
        assert importlib.util.find_spec(f"trl.scripts.{command}") is not None
        assert f"`trl {command}`" in kind.exported_as["trl"]
        assert set(kind.tool_export.tools) == set(kind.tool_forms) - {"trl"}


def test_an_unknown_trainer_is_refused_naming_the_known_ones():
    with pytest.raises(AutotuneError, match="--trainer ppo: choose one of trainer, sft, dpo"):
        get("ppo")


def test_the_identity_keeps_the_trainer_only_where_it_is_not_the_default():
    assert trainers.identity_entries("trainer", "all") == {}
    assert trainers.identity_entries("sft", "assistant") == {"trainer": "sft", "loss_on": "assistant"}
    assert trainers.of_identity({}) is trainers.DEFAULT
    assert trainers.of_identity({"trainer": "sft"}) is SFT


def test_the_model_as_a_trainer_trains_it():
    from autotune.spec.models import resolve_model

    model = resolve_model("llama-tiny")
    assert trainers.with_model(model, get("trainer")) == model
    assert trainers.with_model(model, SFT) == dataclasses.replace(model, fused_lm_head=True, pads_to_longest=True)


@pytest.mark.parametrize(
    ("columns", "requested", "expected"),
    [
        (["messages"], None, "sft"),
        (["prompt", "completion"], None, "sft"),
        (["text"], None, "trainer"),  # a text column stays the Trainer's unless asked
        (["text"], "sft", "sft"),
        (["messages"], "trainer", "trainer"),
        (None, None, "trainer"),  # synthetic tokens
    ],
)
def test_the_trainer_follows_the_rows_unless_chosen(columns, requested, expected):
    assert choose(requested, columns).name == expected


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (None, "--trainer sft trains on your rows: give --dataset"),
        (["input_ids"], "has no messages, prompt and completion, or text column"),
    ],
)
def test_sft_without_rows_it_reads_is_refused(columns, message):
    with pytest.raises(AutotuneError, match=message):
        choose("sft", columns)


def test_what_sft_cannot_train_is_refused_in_one_line():
    with pytest.raises(
        AutotuneError, match="trains causal language models; the model trains as sequence-classification"
    ):
        SFT.check_workload("sequence-classification", False, None)
    with pytest.raises(AutotuneError, match="under --trainer sft TRL packs: search `packing: \\[off, bfd\\]`"):
        SFT.check_workload("causal-lm", True, None)
    with pytest.raises(AutotuneError, match="--text-column picks the Trainer's text column"):
        SFT.check_workload("causal-lm", False, "body")
    SFT.check_workload("causal-lm", False, None)


def test_the_trainer_option_says_every_trainer_and_which_the_rows_choose():
    """``--trainer``'s help is the registry's: a trainer added there is in it, with the rows it is chosen for."""
    text = trainers.option_help()
    for kind in trainers.REGISTERED:
        assert f"{kind.name} ({kind.option_words})" in text
        if kind.chosen_for_formats:
            assert f"{kind.name} for a --dataset of {kind.chosen_words}" in text
    assert text.endswith(f"else {trainers.DEFAULT.name}.")


def test_an_unknown_corpus_format_names_every_format():
    """``chat-corpus --format``: the chat corpus's forms and every trainer's own (``corpus_forms``), named in one line."""
    from autotune.spec.chat_corpus import FORMATS

    with pytest.raises(AutotuneError, match="--format 'pairs' is not known: choose one of") as raised:
        trainers.write_corpus("unused.jsonl", 3, fmt="pairs")
    assert all(fmt in str(raised.value) for fmt in (*FORMATS, *trainers.corpus_forms()))


def test_a_trainers_generated_rows_choose_that_trainer(tmp_path):
    """The rows of each form a trainer adds to ``chat-corpus`` are rows that trainer reads and is chosen for,
    and the option's help names the form."""
    import typing

    from autotune.plan.cli_options import CorpusFormat
    from autotune.spec.dataset_files import peek_rows

    help_text = typing.get_args(CorpusFormat)[1].help
    for kind in trainers.REGISTERED:
        for fmt, form in kind.corpus_forms.items():
            out = tmp_path / f"{fmt}.jsonl"
            assert trainers.write_corpus(str(out), 4, fmt=fmt, length_scale=0.1) > 0
            columns, _first = peek_rows(str(out))
            assert choose(None, columns) is kind, fmt
            assert f"{fmt} ({form.words})" in help_text
