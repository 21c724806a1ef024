"""``--trainer dpo`` (autotune/trainers/dpo.py) in this process: chosen by the rows, its checks of the rows
as TRL will read them (and the pairs TRL drops, counted as TRL counts them), and what a built trainer
answers (its fullest batch, the timed reference pass, ``max_length``), on TRL's real DPOTrainer with a
1-layer llama-tiny of random weights and the synthetic tokenizer (built, never trained here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autotune.errors import AutotuneError
from autotune.spec.chat_corpus import CHATML_TEMPLATE, lexicon
from autotune.spec.synthetic_tokenizer import build_tokenizer
from autotune.trainers import choose
from autotune.trainers.dpo import DPO, batch_real_tokens

VOCAB = 32000  # llama-tiny's
PATH = "prefs.jsonl"


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer(VOCAB)


def text(tokens: int) -> str:
    """A plain string of ``tokens`` corpus words: as many tokens under the synthetic tokenizer (one word, one
    token), ending on a newline so that TRL's ``prompt + answer`` starts the answer on a word of its own."""
    return " ".join(lexicon()[:tokens]) + "\n"


def text_pair(prompt_tokens: int, chosen: str = "yes", rejected: str = "no") -> dict[str, Any]:
    return {"prompt": text(prompt_tokens), "chosen": chosen, "rejected": rejected}


def chat_pair(prompt_words: int) -> dict[str, Any]:
    return {
        "prompt": [{"role": "user", "content": text(prompt_words).strip()}],
        "chosen": [{"role": "assistant", "content": "yes"}],
        "rejected": [{"role": "assistant", "content": "no"}],
    }


# --- chosen by the rows


@pytest.mark.parametrize(
    ("columns", "expected"),
    [
        (["prompt", "chosen", "rejected"], "dpo"),
        (["chosen", "rejected"], "dpo"),  # TRL extracts the prompt from the answers' shared start
        (["prompt", "chosen", "rejected", "tools"], "dpo"),
        (["messages"], "sft"),
        (["prompt", "completion"], "sft"),
    ],
)
def test_preference_pairs_choose_dpo_and_chat_rows_sft(columns, expected):
    assert choose(None, columns).name == expected


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (["messages"], "--trainer dpo: the dataset has no chosen and rejected columns (columns: messages)"),
        (["prompt", "completion"], "DPOTrainer reads prompt/chosen/rejected rows"),
        (None, "--trainer dpo trains on your preference pairs: give --dataset"),
    ],
)
def test_dpo_on_rows_it_cannot_read_is_refused_in_one_line(columns, message):
    with pytest.raises(AutotuneError, match=message.replace("(", r"\(").replace(")", r"\)")) as refused:
        choose("dpo", columns)
    assert "\n" not in str(refused.value)


# --- the rows checked as TRL reads them, and the pairs it drops


def test_a_prompt_of_seq_len_tokens_or_more_is_counted_dropped(tokenizer):
    seq_len = 16
    rows = [text_pair(seq_len - 1), text_pair(seq_len), text_pair(seq_len + 9), chat_pair(2), chat_pair(seq_len)]
    dropped = DPO.dropped_rows(enumerate(rows), tokenizer, "preference", seq_len, "all", PATH)
    # The text prompts: seq_len - 1 tokens kept, seq_len and more dropped. A chat prompt is its words plus
    # ChatML's (<|im_start|> user ... <|im_end|> <|im_start|> assistant): 2 words fit, 16 do not.
    assert dropped == 3
    assert DPO.dropped_rows(enumerate(rows), tokenizer, "preference", 1024, "all", PATH) == 0


def test_a_row_without_a_prompt_is_never_counted_dropped(tokenizer):
    """TRL extracts its prompt from the answers' shared start, which is no longer than either answer."""
    rows = [{"chosen": text(40), "rejected": text(40)}]
    assert DPO.dropped_rows(enumerate(rows), tokenizer, "preference", 8, "all", PATH) == 0


@pytest.mark.parametrize(
    ("row", "fault"),
    [
        ({"prompt": "hi\n", "chosen": "", "rejected": "no"}, "chosen is empty"),
        ({"prompt": "hi\n", "chosen": "yes"}, "rejected is empty"),
        (
            {**chat_pair(2), "chosen": "yes"},
            "prompt, chosen and rejected must all be text or all lists of messages",
        ),
        (
            {**chat_pair(2), "rejected": ["no"]},
            'a message is not a role/content dict: "no"',
        ),
        ({"prompt": "hi\n", "chosen": 3, "rejected": "no"}, "chosen is int: TRL reads a string or a list of messages"),
        ({"prompt": 7, "chosen": "yes", "rejected": "no"}, "prompt is int: TRL reads a string or a list of messages"),
    ],
)
def test_a_bad_row_is_named_with_its_number_and_fault(tokenizer, row, fault):
    rows = [text_pair(3), text_pair(4), row]
    with pytest.raises(AutotuneError) as refused:
        DPO.dropped_rows(enumerate(rows), tokenizer, "preference", 64, "all", PATH)
    assert str(refused.value) == f"--dataset {PATH}: row 3: {fault}"


def test_the_note_of_dropped_pairs_says_how_many_and_all_dropped_is_refused():
    assert DPO.dropped_rows_note(0, 40, 64, "all", PATH) is None
    note = DPO.dropped_rows_note(3, 40, 64, "all", PATH)
    assert note is not None and "TRL drops 3 of the 40 pairs" in note and "fills 64 tokens" in note
    with pytest.raises(AutotuneError, match=f"--dataset {PATH}: every prompt fills the first 64 tokens") as refused:
        DPO.dropped_rows_note(40, 40, 64, "all", PATH)
    assert "raise --seq-len" in str(refused.value)


def test_max_length_is_the_sequence_length_whatever_the_arguments_say():
    pytest.importorskip("trl")
    from trl import DPOConfig

    arguments = DPO.trial_arguments({"beta": 0.3, "max_length": 7, "use_cpu": True}, 128, "all")
    assert arguments == {"beta": 0.3, "max_length": 128, "use_cpu": True}
    assert DPOConfig(output_dir="unused", **arguments).max_length == 128


# --- a built DPOTrainer: TRL's real preparation, collator and reference pass


def built(
    root: Path,
    rows: list[dict[str, Any]],
    seq_len: int,
    micro_batch: int = 2,
    tokenizer_dir: str | None = None,
    peft_config: Any = None,
    **levers: Any,
) -> Any:
    """TRL's DPOTrainer as a trial builds it (``DPO.build``) on ``rows``: a 1-layer llama-tiny, fp32, the
    synthetic tokenizer (or the one saved in ``tokenizer_dir``)."""
    pytest.importorskip("trl")
    import torch

    from autotune.spec.model_catalog import catalog_entry
    from autotune.spec.models import build_model
    from benchmarks.bench_dpo_levers import dpo_trainer, saved_dpo_rows

    config = {key: value for key, value in catalog_entry("llama-tiny").items() if not key.startswith("_")}
    torch.manual_seed(0)
    model = build_model({**config, "num_hidden_layers": 1}, "causal-lm")
    arguments = {
        "output_dir": str(root / "out"),
        "use_cpu": True,
        "bf16": False,
        "per_device_train_batch_size": micro_batch,
        "report_to": "none",
        "disable_tqdm": True,
        **levers,
    }
    prepared, synthetic = saved_dpo_rows(rows, str(root), VOCAB)
    return dpo_trainer(model, (prepared, tokenizer_dir or synthetic), arguments, seq_len, peft_config=peft_config)


def test_trl_drops_exactly_the_pairs_counted_dropped(tmp_path, tokenizer):
    seq_len = 16
    rows = [text_pair(3), text_pair(seq_len - 1), text_pair(seq_len), text_pair(seq_len + 4), text_pair(5)]
    dropped = DPO.dropped_rows(enumerate(rows), tokenizer, "preference", seq_len, "all", PATH)
    trainer = built(tmp_path, rows, seq_len)
    assert dropped == 2
    assert trainer.args.max_length == seq_len
    assert len(trainer.train_dataset) == len(rows) - dropped


def test_the_fullest_batch_is_the_longest_pairs_as_trls_collator_builds_them(tmp_path):
    # Answers of different lengths: the longest pairs are not the longest prompts alone.
    rows = [
        text_pair(4, chosen="yes", rejected=text(30)),
        text_pair(20),
        text_pair(2),
        text_pair(12, chosen=text(6)),
        text_pair(6),
    ]
    trainer = built(tmp_path, rows, 1024, micro_batch=2)
    batch, words = DPO.fullest_batch(trainer, 2)
    prepared = trainer.train_dataset
    pair = [
        (len(p), len(c), len(r))
        for p, c, r in zip(prepared["prompt_ids"], prepared["chosen_ids"], prepared["rejected_ids"], strict=True)
    ]
    longest = sorted(range(len(pair)), key=lambda i: -(pair[i][0] + max(pair[i][1:])))[:2]
    assert sorted(longest) == [0, 1]  # the 30-word rejected answer's pair and the 20-word prompt's
    # prompt + chosen and prompt + rejected of each: 2 x micro-batch rows, padded to the longest row.
    rows_tokens = [pair[i][0] + pair[i][answer] for answer in (1, 2) for i in longest]
    assert tuple(batch["input_ids"].shape) == (4, max(rows_tokens))
    assert batch_real_tokens(batch) == sum(rows_tokens)
    assert words.startswith("worst-case batch: the 2 longest pairs as TRL's collator builds them")
    assert f"4x{max(rows_tokens)} tokens" in words


def test_the_reference_pass_is_timed_only_under_precompute_ref_log_probs(tmp_path):
    rows = [text_pair(n) for n in (3, 5, 8, 2, 6)]
    precomputed = built(tmp_path / "precomputed", rows, 64, precompute_ref_log_probs=True)
    seconds, samples = DPO.setup_pass(precomputed)
    assert samples == len(rows) and seconds > 0
    assert type(precomputed).__name__ == "DPOTrainer"  # what the trial records as the trainer that trained
    assert {"ref_chosen_logps", "ref_rejected_logps"} <= set(precomputed.train_dataset.column_names)
    assert precomputed.ref_model is None  # the log-probabilities are in the rows: no reference copy
    in_steps = built(tmp_path / "in-steps", rows, 64)
    assert DPO.setup_pass(in_steps) == (0.0, 0)
    assert in_steps.ref_model is not None and in_steps.ref_model is not in_steps.model  # a copy, as TRL loads one


def test_under_peft_the_reference_is_the_base_model_with_the_adapters_disabled(tmp_path):
    pytest.importorskip("peft")
    from peft import LoraConfig, PeftModel

    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = built(tmp_path, [text_pair(n) for n in (3, 5, 8, 2)], 64, peft_config=lora)
    assert trainer.ref_model is None
    assert isinstance(trainer.model, PeftModel)
    assert list(trainer.model.peft_config) == ["default"]  # no "ref" adapter copy: TRL disables the adapters


# A chat template that renders the row's tools and a chat_template_kwargs variable before the conversation, as a
# real model's does (Qwen's, Llama 3's render the tool schemas in the prompt): TRL passes both to the template.
TOOLS_TEMPLATE = "{% if tools %}{{ tools | tojson }}\n{% endif %}{% if note %}{{ note }}\n{% endif %}" + CHATML_TEMPLATE


def test_a_prompt_is_rendered_with_the_rows_tools_and_template_keywords_as_trl_renders_it(tmp_path, tokenizer):
    """TRL renders a conversational prompt with the row's ``tools`` and ``chat_template_kwargs``
    (dpo_trainer.py ``tokenize_fn``): a short prompt whose tool schemas or template keywords fill ``seq_len``
    is dropped by TRL, and counted so."""
    seq_len = 24
    schema = json.dumps([{"type": "function", "function": {"name": "lookup", "description": text(40).strip()}}])
    rows = [
        {**chat_pair(2), "tools": "[]", "chat_template_kwargs": {"note": ""}},
        {**chat_pair(2), "tools": schema, "chat_template_kwargs": {"note": ""}},
        {**chat_pair(2), "tools": "[]", "chat_template_kwargs": {"note": text(40).strip()}},
        {**chat_pair(3), "tools": "[]", "chat_template_kwargs": {"note": "short"}},
    ]
    tokenizer.chat_template = TOOLS_TEMPLATE
    try:
        dropped = DPO.dropped_rows(enumerate(rows), tokenizer, "preference", seq_len, "all", PATH)
        directory = str(tmp_path / "tools-tokenizer")
        tokenizer.save_pretrained(directory)
    finally:
        tokenizer.chat_template = CHATML_TEMPLATE
    trainer = built(tmp_path, rows, seq_len, tokenizer_dir=directory)
    assert len(trainer.train_dataset) == 2  # TRL dropped the pairs whose tools or note fill the prompt
    assert dropped == 2


@pytest.mark.parametrize(
    ("extras", "fault"),
    [
        ({"tools": "[{"}, "tools is not JSON"),
        ({"chat_template_kwargs": ["note"]}, r"chat_template_kwargs is a list \(\['note'\]\), not a mapping"),
    ],
)
def test_a_rows_bad_tools_or_template_keywords_are_named(tokenizer, extras, fault):
    with pytest.raises(AutotuneError, match=f"--dataset {PATH}: row 1: {fault}"):
        DPO.dropped_rows(enumerate([{**chat_pair(2), **extras}]), tokenizer, "preference", 64, "all", PATH)


def test_a_chat_template_that_fails_on_a_row_names_the_row(tokenizer):
    """A template that raises on a row (here: no system turn first) fails every trial: one line, the row named."""
    tokenizer.chat_template = (
        '{% if messages[0]["role"] != "system" %}{{ raise_exception("a system turn first") }}{% endif %}'
    )
    try:
        with pytest.raises(AutotuneError) as refused:
            DPO.dropped_rows(enumerate([chat_pair(2)]), tokenizer, "preference", 64, "all", PATH)
    finally:
        tokenizer.chat_template = CHATML_TEMPLATE
    assert str(refused.value) == (
        f"--dataset {PATH}: row 1: the chat template fails on it (TemplateError: a system turn first): "
        "fix the row or the template"
    )


@pytest.mark.parametrize("field", ["max_length", "truncation_mode", "model_init_kwargs", "sync_ref_model"])
def test_base_args_may_not_set_what_autotune_sets_or_counts_under_dpo(tmp_path, field):
    """keep_end would make TRL keep pairs autotune counts as dropped: DPO's fields autotune sets or counts by are
    refused in one line, naming the field and why."""
    pytest.importorskip("trl")
    from autotune.plan._base_args import load_base_args

    path = tmp_path / "base.json"
    path.write_text(json.dumps({field: {"max_length": 64, "truncation_mode": "keep_end"}.get(field, True)}))
    with pytest.raises(AutotuneError, match=f"--base-args {path}: remove {field}: "):
        load_base_args(str(path), "dpo")


def test_every_trial_pays_the_reference_pass_even_where_trl_could_read_an_earlier_trials_cache(tmp_path):
    """TRL caches the precomputed log-probabilities beside the rows, keyed by the rows and the weights' hash
    (dpo_trainer.py:1174-1183); trials of one study share the prepared rows and, seeded, the same weights. A
    second trial that read the first's cache would time no pass and rank itself too fast: each trial runs the
    reference's forward over its rows itself, as a user's first run does."""
    pytest.importorskip("trl")
    import torch

    from autotune.spec.model_catalog import catalog_entry
    from autotune.spec.models import build_model
    from benchmarks.bench_dpo_levers import dpo_trainer, saved_dpo_rows

    config = {key: value for key, value in catalog_entry("llama-tiny").items() if not key.startswith("_")}
    rows = [text_pair(n) for n in (3, 5, 8, 2)]
    saved = saved_dpo_rows(rows, str(tmp_path), VOCAB)
    forwards = []
    for trial in range(2):
        torch.manual_seed(0)  # as every trial: the same weights, the same hash
        model = build_model({**config, "num_hidden_layers": 1}, "causal-lm")
        counted: list[int] = []
        model.register_forward_hook(lambda *_, seen=counted: seen.append(1))
        arguments = {
            "output_dir": str(tmp_path / f"out-{trial}"),
            "use_cpu": True,
            "bf16": False,
            "per_device_train_batch_size": 2,
            "report_to": "none",
            "disable_tqdm": True,
            "precompute_ref_log_probs": True,
        }
        trainer = dpo_trainer(model, saved, arguments, 64)
        forwards.append(len(counted))
        assert DPO.setup_pass(trainer)[1] == len(rows)
    assert forwards[0] > 0 and forwards[1] == forwards[0]
