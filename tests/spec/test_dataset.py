"""--dataset: the user's data is read and checked once in the parent, and each trial's dataset
tokenizes it on the fly into samples of exactly --seq-len tokens."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from autotune.errors import AutotuneError
from autotune.runner._loader import load_training_dataset
from autotune.spec.dataset import prepare_dataset
from autotune.spec.models import resolve_model
from tests.support.cli import FAST_SEARCH_ARGS, run_cli_in_process
from tests.support.local_model import corpus, make_local_model, write_jsonl

SEQ_LEN = 16


@pytest.fixture(scope="module")
def texts():
    return corpus(120)


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory, texts):
    return make_local_model(tmp_path_factory.mktemp("bert") / "model", texts, "bert")


@pytest.fixture(scope="module")
def local_bert(bert_dir):
    return resolve_model(str(bert_dir))


@pytest.fixture(scope="module")
def local_gpt2(tmp_path_factory, texts):
    return resolve_model(str(make_local_model(tmp_path_factory.mktemp("gpt2") / "model", texts, "gpt2")))


def prepare(path, model, tmp_path, global_batch=8, steps=4, **kwargs):
    return prepare_dataset(str(path), model, SEQ_LEN, global_batch, steps, str(tmp_path / "cache"), **kwargs)


def test_jsonl_is_tokenized_on_the_fly_truncated_and_padded(tmp_path, texts, local_bert, bert_dir):
    from transformers import AutoTokenizer

    # 8 x (20 + 1) samples is more than a trial can consume of the 120: all are kept, in order.
    description = prepare(write_jsonl(tmp_path / "train.jsonl", texts), local_bert, tmp_path, steps=20)
    assert description.column == "text" and description.tokenizer_dir == str(bert_dir)
    assert description.num_samples == len(texts)
    pickle.loads(pickle.dumps(description))  # it travels to the child inside the TrialJob
    dataset = load_training_dataset(description, local_bert, SEQ_LEN)
    tokenizer = AutoTokenizer.from_pretrained(bert_dir)
    for index in range(20):
        sample = dataset[index]
        expected = tokenizer(texts[index], truncation=True, max_length=SEQ_LEN)["input_ids"]
        assert sample["input_ids"].shape == (SEQ_LEN,)
        assert sample["input_ids"][: len(expected)].tolist() == expected
        assert sample["attention_mask"].tolist() == [1] * len(expected) + [0] * (SEQ_LEN - len(expected))
        assert (sample["input_ids"][len(expected) :] == tokenizer.pad_token_id).all()
        assert sample["labels"].item() == index % 2  # sequence classification: two classes, as synthetic data
    lengths = [int(dataset[i]["attention_mask"].sum()) for i in range(len(texts))]
    assert max(lengths) == SEQ_LEN and min(lengths) < SEQ_LEN  # both truncation and padding happened


def test_language_model_labels_ignore_padding_and_gpt2_pads_with_eos(tmp_path, texts, local_gpt2):
    description = prepare(write_jsonl(tmp_path / "train.jsonl", texts), local_gpt2, tmp_path)
    assert local_gpt2.task == "causal-lm"
    dataset = load_training_dataset(description, local_gpt2, SEQ_LEN)
    short = next(i for i in range(len(texts)) if int(dataset[i]["attention_mask"].sum()) < SEQ_LEN)
    sample = dataset[short]
    real = int(sample["attention_mask"].sum())
    assert sample["labels"][:real].tolist() == sample["input_ids"][:real].tolist()
    assert (sample["labels"][real:] == -100).all()
    assert description.pad_token_id == 0  # <|endoftext|>, the tokenizer's eos: GPT-2 has no pad token


def test_the_data_is_cycled_so_a_trial_never_ends_an_epoch(tmp_path, texts, local_bert):
    description = prepare(
        write_jsonl(tmp_path / "train.jsonl", texts[:40]), local_bert, tmp_path, global_batch=16, steps=9
    )
    dataset = load_training_dataset(description, local_bert, SEQ_LEN)
    assert len(dataset) == 16 * (9 + 1)
    assert torch.equal(dataset[40]["input_ids"], dataset[0]["input_ids"])


def test_packing_cuts_full_blocks_without_padding(tmp_path, texts, local_gpt2):
    from transformers import AutoTokenizer

    data = write_jsonl(tmp_path / "train.jsonl", texts)
    # Room for every block: all documents are packed, in order.
    description = prepare(data, local_gpt2, tmp_path, packing=True, steps=1000)
    tokenizer = AutoTokenizer.from_pretrained(local_gpt2.local_dir)
    stream = [t for text in texts for t in tokenizer(text)["input_ids"]]
    assert description.num_samples == len(stream) // SEQ_LEN
    assert description.tokenizer_dir is None  # tokenized once, in the parent
    dataset = load_training_dataset(description, local_gpt2, SEQ_LEN)
    for index in (0, 1, description.num_samples - 1):
        sample = dataset[index]
        assert sample["input_ids"].tolist() == stream[index * SEQ_LEN : (index + 1) * SEQ_LEN]
        assert sample["attention_mask"].all() and torch.equal(sample["labels"], sample["input_ids"])


def test_only_what_a_trial_can_consume_is_prepared(tmp_path, texts, local_gpt2):
    import datasets

    data = write_jsonl(tmp_path / "train.jsonl", texts)
    text = prepare(data, local_gpt2, tmp_path, global_batch=8, steps=4)
    assert text.num_samples == len(texts) and text.length == 40
    assert datasets.load_from_disk(text.prepared_dir).num_rows == 40  # a random sample of the 120
    packed = prepare(data, local_gpt2, tmp_path, global_batch=8, steps=4, packing=True)
    assert datasets.load_from_disk(packed.prepared_dir).num_rows == 40 <= packed.num_samples


def test_a_saved_dataset_dict_uses_its_train_split(tmp_path, texts, local_bert):
    import datasets

    datasets.DatasetDict(
        train=datasets.Dataset.from_dict({"body": texts[:30], "label": [0] * 30}),
        test=datasets.Dataset.from_dict({"body": texts[30:40], "label": [0] * 10}),
    ).save_to_disk(str(tmp_path / "saved"))
    description = prepare(tmp_path / "saved", local_bert, tmp_path)
    assert description.num_samples == 30  # "body" is the only string column
    datasets.DatasetDict(
        a=datasets.Dataset.from_dict({"text": texts[:10]}), b=datasets.Dataset.from_dict({"text": texts[:10]})
    ).save_to_disk(str(tmp_path / "two"))
    with pytest.raises(AutotuneError, match="no 'train' split among a, b"):
        prepare(tmp_path / "two", local_bert, tmp_path)


def test_pretokenized_ids_need_no_tokenizer_and_must_fit_the_vocabulary(tmp_path, bert_tiny):
    import datasets

    ids = [[101, 2000 + i, 2001, 102] for i in range(20)]
    datasets.Dataset.from_dict({"input_ids": ids}).save_to_disk(str(tmp_path / "ids"))
    description = prepare(tmp_path / "ids", bert_tiny, tmp_path)  # a catalog model: no tokenizer at all
    sample = load_training_dataset(description, bert_tiny, SEQ_LEN)[3]
    assert sample["input_ids"][:4].tolist() == ids[3] and sample["attention_mask"].sum() == 4
    datasets.Dataset.from_dict({"input_ids": [[1, 2, bert_tiny.vocab_size]] * 20}).save_to_disk(str(tmp_path / "big"))
    with pytest.raises(AutotuneError, match=f"token id {bert_tiny.vocab_size} is outside the model's vocabulary"):
        prepare(tmp_path / "big", bert_tiny, tmp_path)


def test_a_text_file_is_one_sample_per_non_blank_line(tmp_path, texts, local_bert):
    path = tmp_path / "train.txt"
    path.write_text("\n\n".join(texts[:30]) + "\n   \n")
    assert prepare(path, local_bert, tmp_path).num_samples == 30


def test_the_prepared_copy_is_reused_until_the_source_changes(tmp_path, texts, local_bert):
    path = write_jsonl(tmp_path / "train.jsonl", texts[:30])
    first = prepare(path, local_bert, tmp_path)
    written = sorted(p.stat().st_mtime_ns for p in (tmp_path / "cache").glob("dataset-*/*"))
    again = prepare(path, local_bert, tmp_path)
    assert again.prepared_dir == first.prepared_dir
    assert sorted(p.stat().st_mtime_ns for p in (tmp_path / "cache").glob("dataset-*/*")) == written
    write_jsonl(path, texts[:50])
    changed = prepare(path, local_bert, tmp_path)
    assert changed.prepared_dir != first.prepared_dir and changed.num_samples == 50


@pytest.mark.slow
def test_dataloader_workers_get_the_same_samples(tmp_path, texts, local_bert):
    description = prepare(write_jsonl(tmp_path / "train.jsonl", texts), local_bert, tmp_path)
    dataset = load_training_dataset(description, local_bert, SEQ_LEN)
    in_process = [b["input_ids"] for b in torch.utils.data.DataLoader(dataset, batch_size=8, num_workers=0)]
    in_workers = [b["input_ids"] for b in torch.utils.data.DataLoader(dataset, batch_size=8, num_workers=2)]
    assert all(torch.equal(a, b) for a, b in zip(in_process, in_workers, strict=True))


def test_unreadable_or_unusable_data_is_one_line(tmp_path, texts, local_bert, bert_tiny, local_gpt2):
    def error_of(path, model=local_bert, **kwargs) -> str:
        with pytest.raises(AutotuneError) as error:
            prepare(path, model, tmp_path, **kwargs)
        assert "\n" not in str(error.value)
        return str(error.value)

    assert "cannot read it (No such file or directory)" in error_of(tmp_path / "absent.jsonl")
    (tmp_path / "plain").mkdir()
    assert "a directory must hold a dataset written by datasets.save_to_disk" in error_of(tmp_path / "plain")
    (tmp_path / "broken.jsonl").write_text('{"text": "fine"}\n\n{"text": \n{"text": "fine"}\n')
    assert "cannot read it (line 3 is not JSON: Expecting value at column 10)" in error_of(tmp_path / "broken.jsonl")
    two = tmp_path / "two.jsonl"
    two.write_text("".join(json.dumps({"title": t, "body": t}) + "\n" for t in texts[:20]))
    assert "no text column (columns: title, body); name the one to train on with --text-column" in error_of(two)
    assert prepare(two, local_bert, tmp_path, text_column="body").num_samples == 20
    assert "--text-column headline: " in error_of(two, text_column="headline")
    numbers = tmp_path / "numbers.jsonl"
    numbers.write_text("".join(json.dumps({"text": i}) + "\n" for i in range(20)))
    assert "column 'text' holds" in error_of(numbers)
    short = write_jsonl(tmp_path / "short.jsonl", texts[:5])
    assert (
        "5 samples (truncated/padded to 16 tokens) is less than one global batch of the search space (8)"
        in error_of(short)
    )
    data = write_jsonl(tmp_path / "train.jsonl", texts)
    assert "bert-tiny has no tokenizer" in error_of(data, model=bert_tiny)


def test_paths_that_are_not_data_and_bytes_that_are_not_text_are_one_line_and_nothing_else(
    tmp_path, texts, local_bert, capfd
):
    """Each is one AutotuneError line, and the datasets library prints nothing of its own first."""
    loop = tmp_path / "loop.jsonl"
    loop.symlink_to(loop)
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    junk = tmp_path / "junk.jsonl"
    junk.write_text("garbage {{{ not json\n%%\n")
    nul = write_jsonl(tmp_path / "nul.jsonl", texts[:20])
    nul.write_bytes(nul.read_bytes() + b"\0\0\0\0\n")
    not_utf8 = tmp_path / "latin1.jsonl"
    text_end = b'", "id": 3}'  # bytes that are not UTF-8 at the end of one text
    not_utf8.write_bytes(
        write_jsonl(tmp_path / "utf8.jsonl", texts[:20]).read_bytes().replace(text_end, b"\xff\xfe" + text_end)
    )
    expected = {
        loop: "cannot read it (Too many levels of symbolic links)",
        fifo: "it is a named pipe (FIFO), not a file or a directory",
        Path("/dev/zero"): "it is a character device, not a file or a directory",
        junk: "cannot read it (line 1 is not JSON: Expecting value at column 1)",
        nul: "cannot read it (line 21 is not JSON: ",
        not_utf8: "column 'text' is not UTF-8 text (",
    }
    for path, words in expected.items():
        capfd.readouterr()
        with pytest.raises(AutotuneError) as error:
            prepare(path, local_bert, tmp_path)
        assert str(error.value).startswith(f"--dataset {path}: {words}") and "\n" not in str(error.value)
        assert capfd.readouterr().err == "", path


def test_a_tokenizer_larger_than_the_model_vocabulary_is_refused(tmp_path, texts, bert_dir):
    import dataclasses

    small = dataclasses.replace(resolve_model(str(bert_dir)), vocab_size=5)
    with pytest.raises(AutotuneError, match="more than the model's vocab_size 5"):
        prepare(write_jsonl(tmp_path / "train.jsonl", texts), small, tmp_path)


def test_a_dataset_shorter_than_one_global_batch_stops_before_any_trial(tmp_path):
    texts = corpus(10)
    model_dir = make_local_model(tmp_path / "my-model", texts, "bert")
    write_jsonl(tmp_path / "tiny.jsonl", texts)
    (tmp_path / "space.yaml").write_text("micro_batch: [8, 16]\n")
    result = run_cli_in_process(
        "search",
        "--model",
        str(model_dir),
        "--dataset",
        "tiny.jsonl",
        "--global-batch",
        "16",
        "--space",
        "space.yaml",
        "--storage",
        f"sqlite:///{tmp_path / 'study.db'}",
        "--work-dir",
        "runs",
        *FAST_SEARCH_ARGS,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "autotune: error: --dataset tiny.jsonl: 10 samples (truncated/padded to 32 tokens) is less than one global "
        "batch of the search space (16); give more data, or cap the batch with --global-batch / --max-global-batch"
    )
    assert not (tmp_path / "study.db").exists() and not list((tmp_path / "runs").glob("trial-*"))


def test_empty_text_rows_follow_one_rule_under_both_trainers(tmp_path):
    """A ``text`` row holding nothing (or only whitespace) trains nothing but its end-of-text token under
    SFTTrainer (8 samples of 1 token rank ``ok``): skipped as the Trainer path skips it, and data of empty
    rows alone refused in one line by both."""
    pytest.importorskip("trl")
    from autotune.spec.dataset import prepare_sft_rows
    from autotune.spec.models import resolve_model
    from autotune.trainers import get, with_model

    model = with_model(resolve_model("llama-tiny"), get("sft"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("".join(json.dumps({"text": text}) + "\n" for text in ["", "  ", "\n"] * 4))
    with pytest.raises(AutotuneError, match="every 'text' value is empty"):
        prepare_sft_rows(str(empty), model, "text", "all", 8, 3, str(tmp_path / "cache"), [], 64, get("sft"))
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps({"text": text}) + "\n" for text in ["", "hello world"] * 10))
    prepared = prepare_sft_rows(str(mixed), model, "text", "all", 8, 3, str(tmp_path / "cache"), [], 64, get("sft"))
    assert prepared.num_samples == 10
    import datasets

    assert set(datasets.load_from_disk(prepared.prepared_dir)["text"]) == {"hello world"}


def test_the_rows_trained_are_the_rows_less_those_the_trainer_drops():
    """Counted on every row: exact; on a part of the data: at that part's rate."""
    from autotune.spec.dataset import kept_rows

    assert kept_rows(60, 1, 60) == 59
    assert kept_rows(10_000, 10, 200) == 9_500
    assert kept_rows(60, 0, 60) == 60
