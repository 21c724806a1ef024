"""The user's own training data (``--dataset``): read and checked once in the parent, loaded by each trial.

Synthetic tokens stay the default (``runner/_trial.py``). With ``--dataset``:

* The orchestrator calls :func:`prepare_dataset` once, before any trial: it reads the data (a
  directory written by ``datasets.save_to_disk``, or JSON lines / JSON / CSV / Parquet / text
  files: ``dataset_files``), finds the text column (or ``input_ids``), checks it holds at least one global batch of
  samples, and writes what the trials read as an Arrow dataset under the work directory: a random
  sample of as many rows as a trial can consume (the whole data if smaller), so preparing a large
  corpus costs one read, not a copy of it. A later run with the same source, tokenizer and space
  reuses it without reading the source again. Every problem is an :class:`AutotuneError` there.
* Each trial child calls :func:`autotune.runner.load_training_dataset`: it memory-maps that copy (milliseconds)
  and tokenizes every sample on the fly with the model's tokenizer, truncated and padded to
  ``--seq-len``, as the DataLoader fetches it. Tokenization is part of the measured step, as in a
  pipeline that tokenizes as it trains, so ``dataloader_workers`` has real work to share.
* With ``packing``, documents are tokenized in the parent, concatenated and cut into blocks of
  exactly ``--seq-len`` tokens (no padding); the child only reads the blocks.

Under ``--trainer sft`` (:func:`prepare_sft_rows`) the parent keeps the rows as they are (the
columns of their format: ``messages``, ``prompt``/``completion`` or ``text``) and finds the
tokenizer (the model's, else the synthetic one: ``autotune.spec.synthetic_tokenizer``); TRL's
``SFTTrainer`` prepares them in each trial (``autotune.runner``).

The ``padding`` lever shapes a batch (:func:`autotune.runner.training_collator`): ``max_length`` pads every sample to
``--seq-len`` (the padding is paid for in every matmul), ``longest`` pads to the batch's longest
sample, ``padding_free`` flattens the batch into one row. Trials count the real (non-padding)
tokens they train (``runner/_trial.py``), and the model FLOPs that rank them count those tokens
only (``flops.py``). Labels: the input ids (pads
ignored with -100) for language models; for sequence classification, two alternating classes as in
the synthetic data (the label values do not change the cost of a step).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import AutotuneError
from autotune.spec.dataset_files import (
    datasets_package,
    has_text,
    holds_text,
    library_logs_quiet,
    pick_column,
    read_rows,
    root_cause,
    source_path,
    usable_rows,
)
from autotune.spec.models import NO_MODEL_CODE, ModelSpec

if TYPE_CHECKING:
    from autotune.spec.sft_rows import RowsReader

# Documents tokenized per batch when packing (the batch size of HF's run_clm example).
_PACKING_BATCH = 1000
# What prepare_dataset learned about a prepared copy, saved next to it.
_META_FILE = "autotune_dataset.json"


@dataclasses.dataclass(frozen=True)
class PreparedDataset:
    """The user's data as :func:`prepare_dataset` left it for the trials.

    Attributes:
        label: What the study's identity and the tables call it (source, column, shape).
        source: The path the user gave, resolved.
        prepared_dir: The Arrow copy the trials memory-map.
        column: The column the trials read (text, or token ids when packed).
        tokenizer_dir: Where the child loads the tokenizer from (``None``: already tokenized).
        pad_token_id: The id padding uses.
        num_samples: Samples of the user's data one epoch trains: under a TRL trainer its rows less those TRL
            drops (counted on the prepared rows, scaled to the whole data where they are a part of it).
        length: Samples a trial's dataset cycles up to (one epoch never ends within a trial).
        packing: Documents were packed into full ``seq_len`` blocks instead of padded.
        token_lengths: Each prepared row's tokens, before truncation (DPO: a pair's two rows): the throughput
            prior's typical batch; empty for packed blocks (full) and a copy prepared before they were kept.
    """

    label: str
    source: str
    prepared_dir: str
    column: str
    tokenizer_dir: str | None
    pad_token_id: int
    num_samples: int
    length: int
    packing: bool
    token_lengths: tuple[int, ...] = ()


def prepare_dataset(
    path: str,
    model: ModelSpec,
    seq_len: int,
    global_batch: int,
    steps: int,
    cache_root: str,
    text_column: str | None = None,
    packing: bool = False,
) -> PreparedDataset:
    """Read and check the user's dataset once, and write what the trials load.

    Args:
        path: A ``save_to_disk`` directory, or a JSON lines / JSON / CSV / Parquet / text file.
        model: The model being tuned; its local directory (or Hugging Face cache entry) holds the tokenizer.
        seq_len: Tokens per sample.
        global_batch: Samples one optimizer step of the space's largest config takes: the data
            must hold at least that many.
        steps: Optimizer steps a trial runs at most. The trials' dataset cycles the data up to
            ``global_batch * (steps + 1)`` samples, so a measurement never crosses an epoch boundary
            (a real epoch is far longer than a trial; so does the synthetic data).
        cache_root: Directory for the prepared copy (under the work directory).
        text_column: The column to train on; found by itself when ``None``.
        packing: Concatenate documents and cut blocks of ``seq_len`` tokens instead of padding.

    Returns:
        What the trials load (:class:`autotune.runner.Workload` ``dataset``).

    Raises:
        AutotuneError: Unreadable data, no usable column, no tokenizer, token ids outside the
            model's vocabulary, or fewer samples than one global batch.
    """
    datasets_package(path)
    source = source_path(path)
    length = global_batch * (steps + 1)
    tokenizer_dir = _tokenizer_dir(model)
    key = _fingerprint(source, tokenizer_dir, text_column, packing, seq_len, model.vocab_size, length)
    prepared_dir = Path(cache_root) / f"dataset-{key}"
    if not (prepared_dir / _META_FILE).is_file():
        with (
            tempfile.TemporaryDirectory(dir=_made(cache_root)) as scratch,  # datasets' own cache, not kept
            library_logs_quiet(),
        ):
            rows = read_rows(source, path, scratch)
            column = pick_column(rows, text_column, path)
            is_text = holds_text(rows, column, path)
            tokenizer = _load_tokenizer(tokenizer_dir, model, path) if is_text else None
            prepared, meta = _prepare_rows(
                rows, column, is_text, tokenizer, seq_len, packing, length, model, path, longest=global_batch
            )
            meta.update(
                column_read=column,
                tokenizer_dir=tokenizer_dir if is_text and not packing else None,
                pad_token_id=_pad_token_id(tokenizer, model),
                token_lengths=[] if packing else _token_lengths(prepared, meta["column"], tokenizer),
            )
            _save_atomically(prepared, meta, prepared_dir)
    meta = json.loads((prepared_dir / _META_FILE).read_text())
    shape = f"packed into blocks of {seq_len} tokens" if packing else f"truncated/padded to {seq_len} tokens"
    if meta["num_samples"] < global_batch:
        raise AutotuneError(
            f"--dataset {path}: {meta['num_samples']} samples ({shape}) is less than one global batch of the search "
            f"space ({global_batch}); give more data, or cap the batch with --global-batch / --max-global-batch"
        )
    return PreparedDataset(
        label=f"{source} ({meta['column_read']!r} {shape})",
        source=str(source),
        prepared_dir=str(prepared_dir.resolve()),
        column=meta["column"],
        tokenizer_dir=meta["tokenizer_dir"],
        pad_token_id=int(meta["pad_token_id"]),
        num_samples=int(meta["num_samples"]),
        length=length,
        packing=packing,
        token_lengths=tuple(meta.get("token_lengths") or ()),  # none in a copy prepared before they were kept
    )


def prepare_sft_rows(
    path: str,
    model: ModelSpec,
    data: str,
    loss_on: str,
    global_batch: int,
    steps: int,
    cache_root: str,
    notes: list[str],
    seq_len: int,
    reader: RowsReader,
) -> PreparedDataset:
    """Read and check the user's rows once for a trainer that prepares them itself (``--trainer sft``, ``dpo``),
    and write what the trials hand it.

    The rows keep their format's columns untouched (TRL prepares them in each trial); as many as a
    trial can take, the longest kept (by their characters, a proxy for tokens) so the fullest batch
    the data makes is met (``autotune.runner``: worst-case batch). The tokenizer is the ``--model``
    directory's (or its Hugging Face cache entry's), else the synthetic tokenizer with a note.

    Args:
        data: The rows' format (``reader.rows_format``: ``autotune.spec.sft.FORMATS``, or preference pairs).
        loss_on: The study's loss: the tokenizer's chat template must mark the assistant's tokens for
            ``assistant`` (``autotune.spec.sft.check_chat_template``).
        notes: Where the synthetic tokenizer's note and the count of rows TRL drops go.
        seq_len: TRL's ``max_length``: what the rows are truncated to.
        reader: The study's trainer: the columns it reads, its check of the rows and of those it drops.

    The rows are checked as TRL will read them (``reader.dropped_rows``): every row the trials
    train on, every time (the loss and ``seq_len`` decide what is trained), and the data's first
    rows where it is read (a user's run starts there).

    Raises:
        AutotuneError: Unreadable data, a tokenizer that cannot load, is larger than the model's
            vocabulary or cannot render the rows, a row TRL or the chat template fails on, no row
            left to train on within ``seq_len``, or fewer rows than one global batch.
    """
    from autotune.spec.sft_rows import FIRST_ROWS
    from autotune.spec.synthetic_tokenizer import tokenizer_dir as synthetic_tokenizer_dir

    datasets_package(path)
    source = source_path(path)
    tokenizer_dir = _tokenizer_dir(model)
    if tokenizer_dir is None:
        tokenizer_dir = synthetic_tokenizer_dir(os.path.join(cache_root, "tokenizers"), model.vocab_size)
        notes.append(
            f"{model.name} has no tokenizer here: the synthetic word-level tokenizer tokenizes {path} "
            "(one corpus word is one token, a ChatML chat template; token counts are the corpus's words)"
        )
    tokenizer = _load_tokenizer(tokenizer_dir, model, path)
    length = global_batch * (steps + 1)
    # "rows-checked": the copy keeps TRL's per-row extras and which rows of the data it holds.
    key = _fingerprint(source, tokenizer_dir, f"sft:{data}:rows-checked", False, 0, model.vocab_size, length)
    prepared_dir = Path(cache_root) / f"dataset-{key}"
    if not (prepared_dir / _META_FILE).is_file():
        with tempfile.TemporaryDirectory(dir=_made(cache_root)) as scratch:
            rows = read_rows(source, path, scratch)
            rows = rows.select_columns(list(reader.columns_kept(data, rows.column_names)))
            if data == "text":  # the Trainer path's rule: a row of no text trains nothing but its end-of-text token
                usable = usable_rows(has_text(rows.data.column("text")), path, "text")
                if len(usable) < rows.num_rows:
                    rows = rows.select(usable)
            chosen: Any = range(min(length, rows.num_rows))
            if rows.num_rows > length:
                sizes = _row_characters(rows)
                chosen = _sample_with_the_longest(sizes, length, global_batch)
            sampled = set(chosen)
            first = [i for i in range(min(FIRST_ROWS, rows.num_rows)) if i not in sampled]
            reader.dropped_rows(((i, rows[i]) for i in first), tokenizer, data, seq_len, loss_on, path)
            meta = {
                "column": data,
                "num_samples": rows.num_rows,
                "column_read": data,
                "tokenizer_dir": tokenizer_dir,
                "rows": [int(i) for i in chosen],
            }
            _save_atomically(rows.select(chosen), {**meta, "pad_token_id": 0}, prepared_dir)
    meta = json.loads((prepared_dir / _META_FILE).read_text())
    if meta["num_samples"] < global_batch:
        raise AutotuneError(
            f"--dataset {path}: {meta['num_samples']} row{'s' if meta['num_samples'] != 1 else ''} is less than one "
            "global batch of the search space "
            f"({global_batch}); give more data, or cap the batch with --global-batch / --max-global-batch"
        )
    sample = datasets_package(path).load_from_disk(str(prepared_dir))
    dropped = reader.dropped_rows(zip(meta["rows"], sample), tokenizer, data, seq_len, loss_on, path)
    notes += filter(None, [reader.dropped_rows_note(dropped, len(sample), seq_len, loss_on, path)])
    return PreparedDataset(
        label=f"{source} ({data} rows, prepared by {reader.words})",
        source=str(source),
        prepared_dir=str(prepared_dir.resolve()),
        column=data,
        tokenizer_dir=meta["tokenizer_dir"],
        pad_token_id=int(meta["pad_token_id"]),
        num_samples=kept_rows(int(meta["num_samples"]), dropped, len(sample)),
        length=length,
        packing=False,
        token_lengths=tuple(reader.row_lengths(_evenly(sample, LENGTH_ROWS), tokenizer, data, loss_on)),
    )


def kept_rows(rows: int, dropped: int, checked: int) -> int:
    """The rows of the data the trainer trains on, of ``rows``, where ``dropped`` of the ``checked`` rows it was read
    for are dropped (all of them where ``checked`` is every row; else at the checked rows' rate): what one epoch of
    the user's run trains, and so what its projected time counts."""
    if not dropped or not checked:
        return rows
    return rows - dropped if checked >= rows else round(rows * (1 - dropped / checked))


# Rows whose tokens the throughput prior's typical batch is drawn from: a trainer's rendering of a chat row takes
# about 2 ms here (2,000 generated rows: 4.0 s), and the prepared rows run to global batch x (steps + 1).
LENGTH_ROWS = 1000


def _evenly(rows: Any, most: int) -> Any:
    """Every k-th of ``rows``, at most about ``most`` of them (all where there are no more)."""
    step = max(1, -(-len(rows) // most))
    return rows.select(range(0, len(rows), step)) if step > 1 else rows


def _token_lengths(rows: Any, column: str, tokenizer: Any) -> list[int]:
    """Each prepared sample's tokens, before truncation, as the trials tokenize it (``runner._loader``): the
    throughput prior's typical batch (packed blocks are full: none kept for them)."""
    values = list(rows[column])
    if tokenizer is None:
        return [len(ids) for ids in values]
    return [len(ids) for ids in tokenizer(values)["input_ids"]]


def _row_characters(rows: Any) -> Any:
    """Each row's size in characters of its JSON form (chat rows are lists of messages)."""
    import numpy

    return numpy.array([len(json.dumps(row, ensure_ascii=False)) for row in rows])


def _tokenizer_dir(model: ModelSpec) -> str | None:
    """Where the model's tokenizer lives: its local directory, or its Hugging Face cache entry."""
    if model.local_dir and any(
        (Path(model.local_dir) / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt")
    ):
        return model.local_dir
    if model.source == "hf-cache":
        return model.name
    return None


def _load_tokenizer(tokenizer_dir: str | None, model: ModelSpec, path: str) -> Any:
    from transformers import AutoTokenizer

    if tokenizer_dir is None:
        raise AutotuneError(
            f"--dataset {path} holds text, and {model.name} has no tokenizer to turn it into tokens: pass --model as a "
            "local model directory that holds one (tokenizer.json / tokenizer_config.json), or a dataset of input_ids"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True, **NO_MODEL_CODE)
    except Exception as exc:  # noqa: BLE001 - any loader failure means "no usable tokenizer"
        raise AutotuneError(
            f"--dataset {path}: cannot load the tokenizer of {model.name} ({root_cause(exc)})"
        ) from None
    if len(tokenizer) > model.vocab_size:
        raise AutotuneError(
            f"--dataset {path}: the tokenizer of {model.name} has {len(tokenizer)} tokens, more than the model's "
            f"vocab_size {model.vocab_size}; fix the config's vocab_size"
        )
    return tokenizer


def _pad_token_id(tokenizer: Any, model: ModelSpec) -> int:
    """The tokenizer's pad token, else its end-of-sequence token (GPT-2 has no pad), else the config's."""
    for candidate in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if candidate is not None:
            return int(candidate)
    return int(model.config_value("pad_token_id") or 0)


def _prepare_rows(
    rows: Any,
    column: str,
    is_text: bool,
    tokenizer: Any,
    seq_len: int,
    packing: bool,
    length: int,
    model: ModelSpec,
    path: str,
    longest: int = 0,
) -> tuple[Any, dict[str, Any]]:
    """What the trials read, and what to know about it.

    Args:
        longest: Where the data holds more than ``length`` samples, the sample keeps the data's
            ``longest`` longest ones (by characters for text, a proxy for tokens; by tokens for ids):
            every trial also runs the fullest batch its data can produce (``autotune.runner``,
            worst-case batch), which a real run over the whole data meets.

    Returns:
        (rows, meta): at most ``length`` rows of one column, a random sample when there are more
        (``text``, ``input_ids``, or packed ``input_ids`` blocks); and ``column`` and
        ``num_samples`` (every usable sample of the data; for packing, the blocks prepared).
    """
    import datasets
    import pyarrow
    import pyarrow.compute

    values = rows.data.column(column)
    if is_text:
        usable = has_text(values)
    else:
        usable = pyarrow.compute.greater(pyarrow.compute.list_value_length(values), 0)
        largest = pyarrow.compute.max(pyarrow.compute.list_flatten(values)).as_py() or 0
        if largest >= model.vocab_size:
            raise AutotuneError(
                f"--dataset {path}: token id {largest} is outside the model's vocabulary (vocab_size {model.vocab_size})"
            )
    indices = usable_rows(usable, path, column)
    rows = rows.select_columns([column])
    if len(indices) < rows.num_rows:
        rows = rows.select(indices)
    chosen: Any = range(min(length, rows.num_rows))
    if rows.num_rows > length and not packing:
        sizes = (pyarrow.compute.utf8_length if is_text else pyarrow.compute.list_value_length)(values)
        chosen = _sample_with_the_longest(sizes.take(pyarrow.array(indices)).to_numpy(), length, longest)
    elif rows.num_rows > length:
        rows = rows.shuffle(seed=0)  # a random sample: text lengths (tokenization cost) as in the whole data
    if not packing:
        output = "text" if is_text else "input_ids"
        sample = rows.select(chosen)
        if column != output:
            sample = sample.rename_column(column, output)
        return sample, {"column": output, "num_samples": rows.num_rows}
    blocks: list[list[int]] = []
    for batch in rows.iter(batch_size=_PACKING_BATCH):
        documents = tokenizer(batch[column])["input_ids"] if is_text else batch[column]
        blocks += _pack(documents, seq_len)
        if len(blocks) >= length:
            break
    return datasets.Dataset.from_dict({"input_ids": blocks[:length]}), {
        "column": "input_ids",
        "num_samples": len(blocks),
    }


def _sample_with_the_longest(sizes: Any, length: int, longest: int) -> list[int]:
    """``length`` positions: the ``longest`` largest ``sizes``, then a random sample (seed 0) of the
    rest, so text lengths (tokenization cost) stay as in the whole data."""
    import numpy

    top = numpy.argsort(-sizes, kind="stable")[: min(longest, length)]
    others = numpy.setdiff1d(numpy.arange(len(sizes)), top)
    rest = numpy.random.default_rng(0).permutation(others)[: length - len(top)]
    return [int(i) for i in numpy.concatenate([rest, top])]


def _pack(documents: list[list[int]], seq_len: int) -> list[list[int]]:
    """Concatenate token lists and cut blocks of ``seq_len``; the remainder of the batch is dropped
    (as HF's run_clm example does)."""
    stream = [token for document in documents for token in document]
    return [stream[start : start + seq_len] for start in range(0, len(stream) - seq_len + 1, seq_len)]


def _fingerprint(
    source: Path,
    tokenizer_dir: str | None,
    text_column: str | None,
    packing: bool,
    seq_len: int,
    vocab_size: int,
    length: int,
) -> str:
    """Identifies a prepared copy: the source and tokenizer files (path, size, mtime) and every
    option that shapes what is prepared."""
    # "longest-kept": the sample keeps the data's longest samples (see _prepare_rows).
    digest = hashlib.sha256(
        f"{source}|{text_column}|{packing}|{seq_len if packing else ''}|{vocab_size}|{length}|longest-kept".encode()
    )
    paths = sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else [source]
    if tokenizer_dir and Path(tokenizer_dir).is_dir():
        paths += sorted(p for p in Path(tokenizer_dir).iterdir() if p.is_file())
    elif tokenizer_dir:
        digest.update(tokenizer_dir.encode())
    for file in paths:
        stat = file.stat()
        digest.update(f"{file}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def _made(directory: str) -> str:
    Path(directory).mkdir(parents=True, exist_ok=True)
    return directory


def _save_atomically(rows: Any, meta: dict[str, Any], target: Path) -> None:
    """Write to a scratch directory then rename, so a killed run never leaves a half-written copy."""
    scratch = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    rows.flatten_indices().save_to_disk(str(scratch))
    (scratch / _META_FILE).write_text(json.dumps(meta))
    try:
        os.replace(scratch, target)
    except OSError:  # another worker wrote the same copy first
        shutil.rmtree(scratch, ignore_errors=True)
