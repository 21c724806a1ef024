"""The synthetic tokenizer (autotune/spec/synthetic_tokenizer.py): one corpus word is one token,
its ids fit the model's vocabulary, its ChatML template marks what the assistant says, and TRL's
SFTTrainer trains a catalog decoder with it on the generated corpus."""

from __future__ import annotations

import math
import os

import pytest

from autotune.errors import AutotuneError
from autotune.spec.chat_corpus import (
    DEFAULT_SHAPE,
    as_format,
    conversation_tokens,
    conversations,
    lexicon,
    render_chatml,
)
from autotune.spec.synthetic_tokenizer import SPECIAL_TOKENS, build_tokenizer, tokenizer_dir, vocabulary

LLAMA_TINY_VOCAB = 32000


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(LLAMA_TINY_VOCAB)


@pytest.fixture(scope="module")
def chats() -> list[list[dict[str, str]]]:
    return list(conversations(40, seed=2, shape=DEFAULT_SHAPE.scaled(0.2)))


def test_every_id_fits_the_model_vocabulary(tokenizer):
    assert len(tokenizer) <= LLAMA_TINY_VOCAB
    small = build_tokenizer(300)
    assert len(small) == 300 and max(small.get_vocab().values()) == 299
    # A word the small vocabulary has no room for is still one token: <|unk|>.
    rare = lexicon()[-1]
    assert small(rare)["input_ids"] == [small.unk_token_id]


def test_a_vocabulary_too_small_is_refused():
    with pytest.raises(AutotuneError, match="vocab_size 20 is too small"):
        vocabulary(20)


def test_special_tokens_are_distinct_and_padding_is_not_the_end_of_turn(tokenizer):
    ids = [tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS]
    assert len(set(ids)) == len(ids) and tokenizer.unk_token_id not in ids[:-1]
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.eos_token == "<|im_end|>"
    assert (
        tokenizer.pad_token_id != tokenizer.eos_token_id
    )  # a padding-free count of non-pad tokens keeps every end of turn


def test_one_word_is_one_token_and_text_round_trips(tokenizer, chats):
    for messages in chats[:10]:
        for message in messages:
            ids = tokenizer(message["content"], add_special_tokens=False)["input_ids"]
            assert len(ids) == len(message["content"].split())
            assert tokenizer.unk_token_id not in ids
            assert tokenizer.decode(ids) == message["content"]


def test_the_chat_template_renders_chatml_and_counts_as_drawn(tokenizer, chats):
    for messages in chats:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        assert text == render_chatml(messages) == as_format(messages, "text")["text"]
        ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
        assert len(ids) == conversation_tokens(messages)
    prompt = tokenizer.apply_chat_template(chats[0][:-1], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")


def test_the_assistant_mask_covers_what_the_assistant_says_and_its_end_of_turn(tokenizer, chats):
    for messages in chats:
        out = tokenizer.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        masked = [token for token, bit in zip(out["input_ids"], out["assistant_masks"]) if bit]
        expected = []
        for message in messages:
            if message["role"] == "assistant":
                expected += tokenizer(message["content"], add_special_tokens=False)["input_ids"] + [
                    tokenizer.eos_token_id
                ]
        assert masked == expected


def test_the_tokenizer_directory_is_written_once_and_loads_the_same(tmp_path, tokenizer, chats):
    from transformers import AutoTokenizer

    directory = tokenizer_dir(str(tmp_path), LLAMA_TINY_VOCAB)
    written = os.stat(os.path.join(directory, "tokenizer.json")).st_mtime_ns
    assert tokenizer_dir(str(tmp_path), LLAMA_TINY_VOCAB) == directory
    assert os.stat(os.path.join(directory, "tokenizer.json")).st_mtime_ns == written
    loaded = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    assert loaded.apply_chat_template(chats[0], tokenize=False) == tokenizer.apply_chat_template(
        chats[0], tokenize=False
    )
    assert loaded.get_vocab() == tokenizer.get_vocab()
    assert (loaded.pad_token, loaded.eos_token) == (tokenizer.pad_token, tokenizer.eos_token)


@pytest.mark.slow
def test_sft_trainer_trains_llama_tiny_on_the_corpus(tmp_path, tokenizer):
    """The pieces fit: TRL's SFTTrainer, a catalog decoder built from its config, the generated
    corpus (messages) and this tokenizer, with assistant-only loss, for 2 real optimizer steps."""
    import torch
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from autotune.spec.models import build_model, resolve_model

    spec = resolve_model("llama-tiny")
    torch.manual_seed(0)
    model = build_model(spec.hf_config, spec.task)
    before = model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    rows = [as_format(m, "messages") for m in conversations(16, seed=0, shape=DEFAULT_SHAPE.scaled(0.1))]
    max_length = 256
    args = SFTConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        max_steps=2,
        per_device_train_batch_size=2,
        max_length=max_length,
        assistant_only_loss=True,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    # Assistant-only loss: the labels keep exactly the assistant's tokens and ends of turn.
    for row, prepared in zip(rows, trainer.train_dataset):
        if conversation_tokens(row["messages"]) <= max_length:
            assistant = [m for m in row["messages"] if m["role"] == "assistant"]
            assert sum(label != -100 for label in prepared["labels"]) == sum(
                len(m["content"].split()) + 1 for m in assistant
            )
    trainer.train()
    assert trainer.state.global_step == 2
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert len(losses) == 2 and all(math.isfinite(loss) and loss > 0 for loss in losses)
    assert not torch.equal(before, model.model.layers[0].self_attn.q_proj.weight.detach())
