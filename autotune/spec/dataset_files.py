"""Reading the user's ``--dataset``: its path checked, its files read as one dataset, each failure one line."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError
from autotune.spec.files import user_path_kind

# File suffix -> the ``datasets`` builder that reads it; anything else is read as text, one sample a line.
_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def peek_rows(path: str) -> tuple[list[str], dict[str, Any]]:
    """The columns of the user's data and its first row, read without loading the rest (a
    ``save_to_disk`` directory is memory-mapped; a file is streamed): what decides the trainer.

    Raises:
        AutotuneError: No such path, or data that cannot be read.
    """
    datasets = datasets_package(path)
    source = source_path(path)
    if source.is_dir():
        rows = read_rows(source, path, "")
        return list(rows.column_names), dict(rows[0])
    if source.stat().st_size == 0:
        raise AutotuneError(f"--dataset {path}: the file is empty; it holds no samples")
    builder = _FILE_BUILDERS.get(source.suffix.lower(), "text")
    try:
        first = next(iter(datasets.load_dataset(builder, data_files=str(source), split="train", streaming=True)), None)
    except Exception as exc:  # noqa: BLE001 - any reader failure means "cannot read it" to the user
        raise AutotuneError(f"--dataset {path}: cannot read it ({why_unreadable(source, exc)})") from None
    if first is None:
        raise AutotuneError(f"--dataset {path}: it holds no samples")
    return list(first), dict(first)


def why_unreadable(source: Path, exc: BaseException) -> str:
    """Why the reader refused ``source``: for JSON lines, the first line that is not JSON, by number (pandas' reader
    says only "Trailing data at position 23"); else the reader's own root cause."""
    if source.is_file() and _FILE_BUILDERS.get(source.suffix.lower()) == "json":
        with contextlib.suppress(OSError, UnicodeDecodeError), source.open(encoding="utf-8") as lines:
            if not lines.read(1).lstrip().startswith("["):  # one JSON document (an array) has no lines to name
                lines.seek(0)
                for number, line in enumerate(lines, start=1):
                    if not line.strip():
                        continue
                    try:
                        json.loads(line.rstrip("\r\n"))
                    except json.JSONDecodeError as bad:
                        return f"line {number} is not JSON: {bad.msg} at column {bad.colno}"
    return root_cause(exc)


def datasets_package(path: str) -> Any:
    """The ``datasets`` package, its progress bars off; one line where it is not installed."""
    try:
        import datasets
    except ImportError:
        raise AutotuneError(
            f"--dataset {path}: reading your data needs the datasets package: pip install 'autotune[data]'"
        ) from None
    datasets.disable_progress_bars()
    return datasets


def source_path(path: str) -> Path:
    """The ``--dataset`` path, resolved, after the one check of what it is (``spec.files.user_path_kind``)."""
    user_path_kind(Path(path).expanduser(), "--dataset", allowed=("file", "directory"))
    return Path(path).expanduser().resolve()


def read_rows(source: Path, path: str, cache_dir: str) -> Any:
    """The user's data as one ``datasets.Dataset`` (the ``train`` split of a saved DatasetDict)."""
    import datasets

    if source.is_file() and source.stat().st_size == 0:
        # The datasets readers infer no schema from an empty file (a bare StopIteration).
        raise AutotuneError(f"--dataset {path}: the file is empty; it holds no samples")
    try:
        if source.is_dir():
            loaded = datasets.load_from_disk(str(source))
        else:
            builder = _FILE_BUILDERS.get(source.suffix.lower(), "text")
            loaded = datasets.load_dataset(builder, data_files=str(source), split="train", cache_dir=cache_dir)
    except FileNotFoundError:
        raise AutotuneError(
            f"--dataset {path}: a directory must hold a dataset written by datasets.save_to_disk"
        ) from None
    except Exception as exc:  # noqa: BLE001 - any reader failure means "cannot read it" to the user
        raise AutotuneError(f"--dataset {path}: cannot read it ({why_unreadable(source, exc)})") from None
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded and len(loaded) != 1:
            raise AutotuneError(f"--dataset {path}: no 'train' split among {', '.join(loaded)}; save one split")
        loaded = loaded["train"] if "train" in loaded else next(iter(loaded.values()))
    if loaded.num_rows == 0:
        raise AutotuneError(f"--dataset {path}: it holds no samples")
    return loaded


@contextlib.contextmanager
def library_logs_quiet() -> Iterator[None]:
    """The ``datasets`` library's own log lines off while the data is read: a reader logs its failure
    itself before raising it (``logger.error("Failed to load JSON from file ...")``, datasets
    ``packaged_modules/json/json.py``), which autotune's one line then says with its cause."""
    from datasets.utils import logging as datasets_logging

    previous = datasets_logging.get_verbosity()
    datasets_logging.set_verbosity(logging.CRITICAL)
    try:
        yield
    finally:
        datasets_logging.set_verbosity(previous)


def root_cause(exc: BaseException) -> str:
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]  # the chain's cause is an exception too
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def has_text(values: Any) -> Any:
    """Which values hold text beyond whitespace (a pyarrow boolean array, null for a null value)."""
    import pyarrow.compute

    return pyarrow.compute.greater(pyarrow.compute.utf8_length(pyarrow.compute.utf8_trim_whitespace(values)), 0)


def usable_rows(usable: Any, path: str, column: str) -> Any:
    """The indices of the rows ``usable`` marks, the one rule of both trainers' paths: an empty row (no
    text, no token) is skipped, as the Trainer's data collator would train it as padding alone, and
    TRL's as its end-of-text token alone (8 samples of 1 token); data with no usable row is refused.

    Raises:
        AutotuneError: Every row is empty; the line names the column and the first row.
    """
    import pyarrow

    indices = pyarrow.compute.indices_nonzero(usable.fill_null(False)).cast(pyarrow.int64()).to_numpy()
    if len(indices) == 0:
        raise AutotuneError(f"--dataset {path}: every {column!r} value is empty: give rows that hold text")
    return indices


def pick_column(rows: Any, text_column: str | None, path: str) -> str:
    """The column the Trainer path trains on: ``--text-column``, else ``input_ids`` or ``text``, else the one
    column of strings.

    Raises:
        AutotuneError: No such column, or none to pick by itself.
    """
    columns = list(rows.column_names)
    if text_column is not None:
        if text_column not in columns:
            raise AutotuneError(
                f"--text-column {text_column}: {path} has no such column (columns: {', '.join(columns)})"
            )
        return text_column
    for preferred in ("input_ids", "text"):
        if preferred in columns:
            return preferred
    strings = [name for name in columns if getattr(rows.features[name], "dtype", None) in ("string", "large_string")]
    if len(strings) == 1:
        return strings[0]
    raise AutotuneError(
        f"--dataset {path}: no text column (columns: {', '.join(columns)}); name the one to train on with --text-column"
    )


def holds_text(rows: Any, column: str, path: str) -> bool:
    """True for a column of strings, False for one of token-id lists."""
    import pyarrow

    feature = rows.features[column]
    if getattr(feature, "dtype", None) in ("string", "large_string"):
        try:
            # Arrow's JSON and CSV readers take the bytes of a string as they are; the full validation
            # checks that each is UTF-8 (pyarrow Array.validate(full=True)), as every later step assumes.
            rows.data.column(column).validate(full=True)
        except pyarrow.ArrowInvalid as exc:
            raise AutotuneError(
                f"--dataset {path}: column {column!r} is not UTF-8 text ({str(exc).strip().splitlines()[0][:200]}); "
                "save the data as UTF-8"
            ) from None
        return True
    if str(getattr(getattr(feature, "feature", None), "dtype", "")).startswith(("int", "uint")):
        return False
    raise AutotuneError(f"--dataset {path}: column {column!r} holds {feature}, neither text nor token ids")
