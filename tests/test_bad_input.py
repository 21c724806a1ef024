"""Bad input and faults never cost a run, a trial or a file: the cases of a hostile probe (issue 16).

Every case drives the real ``autotune`` command (the table of inputs refused before any trial runs its
entry point in this process, ``run_cli_in_process``, to spare a torch import per case; the rest in a
subprocess), on real files, real storages and
real file systems: a full disk is a small tmpfs filled to the last byte (``tests.support.faults.fill_file_system``),
a read-only database lives on a tmpfs remounted read-only. Mounting needs root (CI runs as root);
elsewhere those cases are skipped with the reason.

Groups (see docs/reliability.md): 1. one line instead of a traceback; 2. refused before the first
trial, so no trial and no seed is spent; 3. nothing accepted silently; 4. state and data (storage,
written files, resume); 5. Ctrl-C and messages.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from autotune.trainers import write_corpus
from tests.support.bad_input import (
    SEARCH,
    TINY_SPACE,
    assert_one_error_line,
    create_study,
)
from tests.support.cli import REPO, run_cli_in_process

BERT_TINY = json.loads((REPO / "autotune" / "catalog" / "bert-tiny.json").read_text())


def _model_dir(root: Path, name: str, content: bytes | str | None = None, **overrides: object) -> str:
    """A local model directory whose config.json is ``content``, or bert-tiny's with ``overrides``."""
    directory = root / name
    directory.mkdir()
    if content is None:
        values = {k: v for k, v in BERT_TINY.items() if not k.startswith("_autotune")}
        content = json.dumps({**values, **overrides})
    (directory / "config.json").write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(directory)


def _file(root: Path, name: str, content: bytes | str) -> str:
    path = root / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


def _fifo(root: Path, name: str) -> str:
    path = root / name
    os.mkfifo(path)
    return str(path)


BINARY = bytes(range(128, 256)) * 2  # not UTF-8 from its first byte


def _cases(root: Path) -> dict[str, tuple[list[str], str]]:
    """Case id -> (command-line arguments, a phrase the one error line must contain)."""
    db = f"sqlite:///{root / 'cases.db'}"
    # A space of the repository's own (the default space resolves through the installed package);
    # a case that gives --space again wins (the last occurrence of an option counts).
    tiny = [*SEARCH, "--storage", db, "--model", "bert-tiny", "--space", TINY_SPACE]
    resumed = _resumed_study(root)  # made by _make_costly_inputs, as is the huge space, for the cases that name them
    missing = f"sqlite:///{root / 'misspelled.db'}"
    llama = [*SEARCH, "--storage", db, "--model", "llama-tiny"]
    chat, pairs = str(root / "chat.jsonl"), str(root / "prefs.jsonl")
    write_corpus(chat, 16, fmt="messages", length_scale=0.1)
    write_corpus(pairs, 16, fmt="preference", length_scale=0.1)

    def model(name: str, content: bytes | str | None = None, **overrides: object) -> list[str]:
        return [*SEARCH, "--storage", db, "--model", _model_dir(root, name, content, **overrides)]

    return {
        # 1. config.json files transformers rejects (search and estimate resolve the model alike)
        "model: invalid JSON": (model("invalid-json", '{"model_type": "bert",'), "cannot read its config.json"),
        "model: binary config": (model("binary", BINARY), "cannot read its config.json"),
        "model: unknown model_type": (
            model("unknown-type", '{"model_type": "warp-drive", "hidden_size": 8}'),
            "warp-drive",
        ),
        "model: no model_type": (model("no-type", '{"hidden_size": 128}'), "model_type"),
        "model: a JSON list": (model("list", "[1, 2]"), "model_type"),
        "model: hidden not divisible by heads": (
            model("indivisible", hidden_size=129),
            "not a multiple of the number of attention heads",
        ),
        # transformers 5's config classes validate themselves (huggingface_hub's strict dataclasses): once a traceback
        "model: a Llama width its class refuses": (
            model(
                "indivisible-llama",
                '{"model_type": "llama", "hidden_size": 100, "num_attention_heads": 3, "num_hidden_layers": 2, '
                '"intermediate_size": 128, "vocab_size": 100}',
            ),
            "The hidden size (100) is not a multiple of the number of attention heads (3)",
        ),
        "model: vocab_size 0": (model("vocab0", vocab_size=0), "vocab_size 0"),
        # torch's nn.Embedding asserts (an AssertionError, once a traceback): a pad token past the vocabulary.
        "model: pad token past the vocabulary": (
            model("pad-past-vocab", pad_token_id=1_000_000),
            "Padding_idx must be within num_embeddings",
        ),
        "model: 0 positions": (model("positions0", max_position_embeddings=0), "max_position_embeddings 0"),
        # Two stacks the FLOPs and the activations do not count: refused, not ranked wrong.
        "model: an encoder-decoder": (
            model(
                "t5-small-shape",
                '{"model_type": "t5", "d_model": 64, "d_ff": 128, "num_layers": 2, "num_heads": 2, "d_kv": 32, '
                '"vocab_size": 100, "is_encoder_decoder": true}',
            ),
            "is an encoder-decoder (t5): trained for sequence-classification it runs two stacks",
        ),
        "model: negative heads": (model("negative-heads", num_attention_heads=-2), "num_heads -2"),
        "estimate: hidden not divisible by heads": (
            ["estimate", "--model", _model_dir(root, "estimate-indivisible", hidden_size=129)],
            "not a multiple",
        ),
        # 1 and 3. space files
        "space: binary": ([*tiny, "--space", _file(root, "binary.yaml", BINARY)], "not a text file"),
        "space: micro_batch [true]": (
            [*tiny, "--space", _file(root, "bool.yaml", "micro_batch: [true]\n")],
            "micro_batch: choice True",
        ),
        "space: checkpointing [1]": (
            [*tiny, "--space", _file(root, "int.yaml", "checkpointing: [1]\n")],
            "checkpointing: choice 1",
        ),
        "space: 700k choices": (
            [
                *tiny,
                "--space",
                str(_huge_space(root)),
            ],
            "larger than 64 KiB",
        ),
        # A space none of whose configs trains (a pair rule: bf16 weights with fp32 autocast only): one line
        # from the pair rule, not the memory prior's traceback over no config (seen on estimate before).
        "space: no pair trains": (
            [
                *SEARCH,
                "--storage",
                db,
                "--model",
                "llama-tiny",
                "--space",
                _file(root, "pair.yaml", "micro_batch: [8]\ndtype: [fp32]\nweight_dtype: [bf16]\n"),
            ],
            "dtype fp32 cannot run with weight_dtype bf16",
        ),
        "estimate: no pair trains": (
            [
                "estimate",
                "--model",
                "llama-tiny",
                "--device",
                "cpu",
                "--space",
                _file(root, "pair2.yaml", "micro_batch: [8]\ndtype: [fp32]\nweight_dtype: [bf16]\n"),
            ],
            "add bf16 to dtype, or fp32 to weight_dtype",
        ),
        "space: 300 choices": (
            [*tiny, "--space", _file(root, "many.yaml", "micro_batch: [" + ", ".join(map(str, range(1, 301))) + "]\n")],
            "micro_batch: 300 choices; give at most 256",
        ),
        # 1. paths that are not files (spec.files.user_path_kind): a reader would block on a pipe for ever
        "space: a named pipe": ([*tiny, "--space", _fifo(root, "space.yaml")], "it is a named pipe (FIFO), not a file"),
        "base-args: a device": ([*tiny, "--base-args", "/dev/zero"], "/dev/zero: it is a character device, not a file"),
        # 1 and 2. --base-args
        "base-args: binary": ([*tiny, "--base-args", _file(root, "binary.json", BINARY)], "not a text file"),
        "base-args: batch 'big'": (
            [*tiny, "--base-args", _file(root, "big.json", '{"per_device_train_batch_size": "big"}')],
            "per_device_train_batch_size 'big': Input should be a valid integer",
        ),
        "base-args: learning_rate 'fast'": (
            [*tiny, "--base-args", _file(root, "fast.json", '{"learning_rate": "fast"}')],
            "learning_rate 'fast'",
        ),
        "base-args: bf16 and fp16": (
            [*tiny, "--base-args", _file(root, "both.json", '{"bf16": true, "fp16": true}')],
            "bf16 and fp16 are both true",
        ),
        "base-args: batch 0": (
            [*tiny, "--base-args", _file(root, "zero.json", '{"per_device_train_batch_size": 0}')],
            "per_device_train_batch_size 0: give 1",
        ),
        "base-args: learning_rate NaN": (
            [*tiny, "--base-args", _file(root, "nan.json", '{"learning_rate": NaN}')],
            "learning_rate nan: not a finite number",
        ),
        "base-args: learning_rate 1e400": (
            [*tiny, "--base-args", _file(root, "huge.json", '{"learning_rate": 1e400}')],
            "learning_rate inf: not a finite number",
        ),
        "base-args: hub_token": (
            [*tiny, "--base-args", _file(root, "token.json", '{"hub_token": "hf_planted"}')],
            "set the HF_TOKEN environment variable",
        ),
        "base-args: torch_compile_backend os.system": (
            [*tiny, "--base-args", _file(root, "backend.json", '{"torch_compile_backend": "os.system"}')],
            "torch_compile_backend 'os.system' is not a torch.compile backend",
        ),
        "base-args: deepspeed unreadable": (
            [
                *tiny,
                "--base-args",
                _file(root, "ds-missing.json", json.dumps({"deepspeed": str(root / "absent-ds.json")})),
            ],
            "deepspeed " + str(root / "absent-ds.json") + ": cannot read it",
        ),
        # 2 and 3. options that would fail every trial or be ignored
        "--trial-timeout 0": ([*tiny, "--trial-timeout", "0"], "--trial-timeout 0.0: give a number of seconds above 0"),
        "--trial-timeout -1": ([*tiny, "--trial-timeout", "-1"], "--trial-timeout -1.0"),
        "--timeout -5": ([*tiny, "--timeout", "-5"], "--timeout -5.0"),
        "--warmup-steps -1": (
            [*tiny, "--warmup-steps", "-1"],
            "--warmup-steps -1: give a whole number from 0, up to and including 10,000",
        ),
        "--max-measure-steps 0": ([*tiny, "--max-measure-steps", "0"], "--max-measure-steps 0"),
        # A step count is bounded: 99999999999 warm-up steps made the seed trial allocate 6.4 TB for its rows,
        # recorded as the config's out-of-memory (issue 38).
        "--warmup-steps 99999999999": (
            [*tiny, "--warmup-steps", "99999999999"],
            "--warmup-steps 99999999999: give a whole number from 0, up to and including 10,000",
        ),
        "--max-measure-steps 10001": (
            [*tiny, "--max-measure-steps", "10001"],
            "--max-measure-steps 10001: give a whole number above 0, up to and including 10,000",
        ),
        "--trials 0 names the option": ([*tiny, "--trials", "0"], "--trials 0: give a whole number above 0"),
        "--confirm-budget 0": (
            [*tiny, "--confirm-budget", "0"],
            "--confirm-budget 0.0: give a fraction above 0, up to and including 1",
        ),
        "--confirm-budget 1.5": ([*tiny, "--confirm-budget", "1.5"], "--confirm-budget 1.5: give a fraction above 0"),
        "--confirm-budget nan": ([*tiny, "--confirm-budget", "nan"], "--confirm-budget nan: give a fraction above 0"),
        "--text-column without --dataset": (
            [*tiny, "--text-column", "text"],
            "--text-column: only used with --dataset",
        ),
        "--packing without --dataset": ([*tiny, "--packing"], "--packing: only used with --dataset"),
        "--workers 1000": ([*tiny, "--workers", "1000"], "--workers 1000: each trial would get"),
        "empty --dataset": ([*tiny, "--dataset", _file(root, "empty.jsonl", "")], "the file is empty"),
        "--trainer dpo on chat rows": (
            [*llama, "--trainer", "dpo", "--dataset", chat],
            "--trainer dpo: the dataset has no chosen and rejected columns (columns: messages)",
        ),
        "base-args: SFTConfig's dataset_num_proc 'many'": (  # a field of TRL's SFTConfig only
            [
                *llama,
                "--dataset",
                chat,
                "--global-batch",
                "8",
                "--base-args",
                _file(root, "sft.json", '{"dataset_num_proc": "many"}'),
            ],
            "dataset_num_proc 'many'",
        ),
        "--loss-on under --trainer dpo": (
            [*llama, "--trainer", "dpo", "--dataset", pairs, "--loss-on", "completion"],
            "--loss-on chooses SFTTrainer's loss; --trainer dpo trains with TRL's DPOTrainer: drop --loss-on",
        ),
        "--loss-on on preference pairs": (
            [*llama, "--dataset", pairs, "--loss-on", "assistant"],
            "--loss-on chooses SFTTrainer's loss, and this study trains with TRL's DPOTrainer",
        ),
        "estimate --seq-len 100000": (
            ["estimate", "--model", "bert-tiny", "--seq-len", "100000"],
            "longer than bert-tiny allows (512",
        ),
        "dashboard --port -1": (["dashboard", "--port", "-1"], "--port -1: give a port from 1 to 65535"),
        "dashboard --port 70000": (["dashboard", "--port", "70000"], "--port 70000"),
        "best --top -5": (["best", "--storage", resumed, "--top", "-5"], "--top -5"),
        "devices --seconds 0": (["devices", "--calibrate", "--seconds", "0"], "--seconds 0.0"),
        # 4. a misspelled SQLite path is not a new, empty database
        "best: misspelled storage": (["best", "--storage", missing], "no such database file"),
        "export: misspelled storage": (
            ["export", "--storage", missing, "--out", str(root / "x.json")],
            "no such database file",
        ),
        "report: misspelled storage": (
            ["report", "--storage", missing, "--out", str(root / "x.html")],
            "no such database file",
        ),
        "estimate: misspelled storage": (
            ["estimate", "--model", "bert-tiny", "--seq-len", "32", "--space", TINY_SPACE, "--storage", missing],
            "no such database file",
        ),
        # 4. a lower ceiling on resume would judge new trials by another rule than the stored ones
        "lower ceiling on resume": (
            [
                *SEARCH,
                "--model",
                "bert-tiny",
                "--space",
                TINY_SPACE,
                "--storage",
                resumed,
                "--study-name",
                "resumed",
                "--memory-ceiling",
                "650MiB",
            ],
            "was searched under a memory ceiling of 1.00 GiB, this run asks 650.00 MiB",
        ),
    }


def _make_costly_inputs(root: Path, args: list[str]) -> None:
    """The two inputs of ``_cases`` that take a fraction of a second each to make (an earlier search's study,
    a 4.7 MB space), made only for a case that names them: every case builds the whole table, 61 times."""
    if _resumed_study(root) in args:
        create_study(_resumed_study(root), "resumed", 1024**3)
    if str(_huge_space(root)) in args:
        _huge_space(root).write_text("micro_batch: [" + ", ".join(map(str, range(1, 700_001))) + "]\n")


def _resumed_study(root: Path) -> str:
    return f"sqlite:///{root / 'resumed.db'}"


def _huge_space(root: Path) -> Path:
    return root / "huge.yaml"


CASE_IDS = [
    "model: invalid JSON",
    "model: binary config",
    "model: unknown model_type",
    "model: no model_type",
    "model: a JSON list",
    "model: hidden not divisible by heads",
    "model: a Llama width its class refuses",
    "model: vocab_size 0",
    "model: pad token past the vocabulary",
    "model: 0 positions",
    "model: an encoder-decoder",
    "model: negative heads",
    "estimate: hidden not divisible by heads",
    "space: binary",
    "space: micro_batch [true]",
    "space: checkpointing [1]",
    "space: 700k choices",
    "space: no pair trains",
    "estimate: no pair trains",
    "space: 300 choices",
    "space: a named pipe",
    "base-args: a device",
    "base-args: binary",
    "base-args: batch 'big'",
    "base-args: learning_rate 'fast'",
    "base-args: bf16 and fp16",
    "base-args: batch 0",
    "base-args: learning_rate NaN",
    "base-args: learning_rate 1e400",
    "base-args: hub_token",
    "base-args: torch_compile_backend os.system",
    "base-args: deepspeed unreadable",
    "--trial-timeout 0",
    "--trial-timeout -1",
    "--timeout -5",
    "--warmup-steps -1",
    "--max-measure-steps 0",
    "--warmup-steps 99999999999",
    "--max-measure-steps 10001",
    "--trials 0 names the option",
    "--confirm-budget 0",
    "--confirm-budget 1.5",
    "--confirm-budget nan",
    "--text-column without --dataset",
    "--packing without --dataset",
    "--workers 1000",
    "empty --dataset",
    "--trainer dpo on chat rows",
    "base-args: SFTConfig's dataset_num_proc 'many'",
    "--loss-on under --trainer dpo",
    "--loss-on on preference pairs",
    "estimate --seq-len 100000",
    "dashboard --port -1",
    "dashboard --port 70000",
    "best --top -5",
    "devices --seconds 0",
    "best: misspelled storage",
    "export: misspelled storage",
    "report: misspelled storage",
    "estimate: misspelled storage",
    "lower ceiling on resume",
]


@pytest.mark.parametrize("case", CASE_IDS)
def test_bad_input_is_one_line_before_any_trial(tmp_path, case):
    args, phrase = _cases(tmp_path)[case]
    _make_costly_inputs(tmp_path, args)
    completed = run_cli_in_process(*args, cwd=tmp_path)
    assert_one_error_line(completed, phrase)
    assert not list(tmp_path.glob("autotune_runs/trial-*"))  # refused before the first trial: no trial ran
    assert not (tmp_path / "misspelled.db").exists()  # a read-only command created no database
    assert not (tmp_path / "cases.db").exists()  # nor did search: it was refused before opening its storage


def test_every_case_is_checked(tmp_path):
    assert CASE_IDS == list(_cases(tmp_path))


def _model_with_its_own_code(root: Path, marker: Path) -> str:
    """A model directory whose config.json names code of its own (``auto_map``) for a model type
    transformers does not know: importing that code writes ``marker``."""
    directory = root / "custom-code-model"
    directory.mkdir()
    (directory / "config.json").write_text(
        json.dumps(
            {
                "model_type": "shipped-net",
                "auto_map": {"AutoConfig": "shipped_code.ShippedConfig", "AutoModel": "shipped_code.ShippedModel"},
                "hidden_size": 128,
                "num_attention_heads": 2,
                "num_hidden_layers": 2,
                "vocab_size": 1000,
            }
        )
    )
    (directory / "shipped_code.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('the model directory ran its own code')\n"
        "from transformers import PretrainedConfig, PreTrainedModel\n"
        "class ShippedConfig(PretrainedConfig):\n    model_type = 'shipped-net'\n"
        "class ShippedModel(PreTrainedModel):\n    config_class = ShippedConfig\n"
    )
    return str(directory)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["search", "estimate"])
def test_a_models_own_code_never_runs_even_when_the_terminal_answers_yes(tmp_path, command):
    """transformers asks "Do you wish to run the custom code? [y/N]" on a terminal unless told
    ``trust_remote_code``; autotune tells it False everywhere, so no question, no code, one line."""
    from tests.support.cli import run_cli_in_terminal

    marker = tmp_path / "ran.txt"
    model = _model_with_its_own_code(tmp_path, marker)
    args = [*SEARCH, "--storage", f"sqlite:///{tmp_path / 'study.db'}"] if command == "search" else ["estimate"]
    status, output = run_cli_in_terminal(*args, "--model", model, cwd=tmp_path, env={"HF_HUB_OFFLINE": "1"})

    assert not marker.exists()  # the directory's Python never ran
    assert "[y/N]" not in output and "custom code" not in output  # and nobody was asked
    assert "hf.co" not in output  # a local directory is not a Hub repository
    lines = [line for line in output.splitlines() if line.strip()]
    assert status == 2, output
    assert len(lines) == 1, output
    assert lines[0].startswith("autotune: error: --model ")
    assert "'shipped-net' is not one of transformers' own architectures" in lines[0]
    assert "autotune trains only those" in lines[0]
    assert not (tmp_path / "study.db").exists()  # refused before the study was opened
