"""What to search (autotune.study._request): the command's options checked once and turned into the
request every trial shares, before any trial runs."""

from __future__ import annotations

import dataclasses
import re

import pytest

from autotune.errors import AutotuneError
from autotune.plan import SearchOptions
from autotune.space import SearchSpace
from autotune.spec.devices import known_gpu
from autotune.study import SearchRequest, default_study_name, prepare_request
from tests.support.cli import REPO

GiB = 1024**3
TINY_SPACE = str(REPO / "search_spaces" / "tiny-test.yaml")


def options(tmp_path, **changes) -> SearchOptions:
    """The options of ``autotune search --model bert-tiny --device cpu --seq-len 32 --space tiny-test.yaml``."""
    settings = {
        "model": "bert-tiny",
        "device": "cpu",
        "seq_len": 32,
        "space": TINY_SPACE,
        "memory_ceiling": "1GiB",
        "work_dir": str(tmp_path / "runs"),
    }
    return SearchOptions(**{**settings, **changes})


def test_prepare_request_builds_the_workload_every_trial_shares(tmp_path):
    prepared = prepare_request(
        options(
            tmp_path,
            warmup_steps=2,
            max_measure_steps=7,
            trial_timeout=60.0,
            prune_ratio=0.3,
            screen=False,
            callbacks=("tests.support.faults:RecordCollectorState",),
        ),
        available_memory_bytes=64 * GiB,
    )
    request = prepared.request
    workload = request.workload
    assert (workload.model.name, workload.device.kind, workload.seq_len) == ("bert-tiny", "cpu", 32)
    assert workload.ceiling_bytes == request.ceiling_bytes == GiB
    assert (workload.measure.warmup_steps, workload.measure.max_steps) == (2, 7)
    assert workload.callbacks == ("tests.support.faults:RecordCollectorState",) and workload.dataset is None
    # A CPU child may grow past the ceiling (to be measured over it), within the host's memory.
    assert GiB < workload.address_space_bytes < 64 * GiB
    assert request.worker_devices == (workload.device,)
    assert (request.trial_timeout_s, request.work_root, request.prune_ratio, request.screen) == (
        60.0,
        str(tmp_path / "runs"),
        0.3,
        False,
    )
    assert set(request.space.choices) >= {"micro_batch", "grad_accum", "checkpointing", "dtype", "optim"}
    assert any(
        note.startswith("no datasheet peak for a CPU") for note in prepared.notes
    )  # what MFU is measured against
    assert not (tmp_path / "runs").exists()  # nothing ran


def test_prepare_request_gives_each_cpu_worker_its_share_of_the_memory(tmp_path):
    one = prepare_request(options(tmp_path), available_memory_bytes=4 * GiB).request
    two = prepare_request(options(tmp_path, workers=2), available_memory_bytes=4 * GiB).request
    assert [device.kind for device in two.worker_devices] == ["cpu", "cpu"]
    assert two.workload.address_space_bytes < one.workload.address_space_bytes
    assert two.workload.address_space_bytes <= 2 * GiB  # two children at once stay within what is available


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"prune_ratio": 1.0}, "--prune-ratio 1.0: give a fraction from 0 (never prune) up to, not including, 1"),
        ({"seq_len": 4096}, "--seq-len 4096 is longer than bert-tiny allows (512 positions)"),
        (
            {"callbacks": ("tests.support.faults:NoSuchCallback",)},
            "--callback 'tests.support.faults:NoSuchCallback': tests.support.faults has no TrainerCallback class named NoSuchCallback",
        ),
        ({"device": "cpu", "workers": 0}, "--workers 0: give a whole number above 0"),
    ],
)
def test_prepare_request_refuses_a_bad_option_before_any_trial(tmp_path, changes, message):
    with pytest.raises(AutotuneError, match=re.escape(message)):
        prepare_request(options(tmp_path, **changes), available_memory_bytes=64 * GiB)
    assert not (tmp_path / "runs").exists()


def test_a_request_for_another_device_keeps_the_search_and_its_identity_names_the_setup(tiny_workload):
    request = SearchRequest(
        workload=tiny_workload(base_args={"seed": 7}), space=SearchSpace(choices={"micro_batch": [8]})
    )
    h100 = known_gpu("h100-sxm").device()
    moved = request.for_device(h100)
    assert moved.workload.device == h100 and moved.workload == dataclasses.replace(request.workload, device=h100)
    assert request.workload.device.kind == "cpu"  # the request it came from is unchanged
    assert request.identity() == {
        "model": "bert-tiny",
        "task": request.workload.model.task,
        "seq_len": 32,
        "device": request.workload.device.name,
        "dataset": "synthetic tokens",
        "base_args": {"seed": 7},
        "peft": None,
    }
    assert moved.identity()["device"] == h100.name


def test_the_default_study_name_is_model_device_and_seq_len(cpu, tmp_path):
    assert default_study_name("bert-tiny", cpu, 32) == "bert-tiny-cpu-s32"
    local = tmp_path / "my model"
    local.mkdir()
    assert default_study_name(str(local), cpu, 128) == "my-model-cpu-s128"  # a local directory: its name, made safe


@pytest.mark.parametrize(
    ("model", "space", "printed"),
    [("gpt2-tiny", None, "llm.yaml"), ("bert-tiny", None, None), ("gpt2-tiny", TINY_SPACE, None)],
)
def test_a_causal_lms_default_space_is_the_llm_space_and_the_notes_say_so(tmp_path, model, space, printed):
    """The Trainer on synthetic tokens: a decoder gets search_spaces/llm.yaml, printed; an encoder the
    default space, and a --space its own file, neither printed."""
    prepared = prepare_request(options(tmp_path, model=model, space=space, memory_ceiling="8GiB"), 16 * GiB)
    source = prepared.request.space.source
    assert source == (space or str(REPO / "search_spaces" / (printed or "default.yaml")))
    said = [note for note in prepared.notes if note.startswith("search space: ")]
    if printed is None:
        assert said == []
    else:
        assert said == [
            f"search space: search_spaces/{printed}, the default for a model trained as causal-lm (--space to give another)"
        ]


# --- the trainer of a study: SFTTrainer for chat rows, fixed for the study


def sft_options(tmp_path, fmt: str = "messages", **changes) -> SearchOptions:
    """``autotune search --model llama-tiny --dataset chat.jsonl --device cpu --seq-len 64`` (the LLM space)."""
    from tests.support.sft import chat_file

    settings = {
        "model": "llama-tiny",
        "device": "cpu",
        "seq_len": 64,
        "dataset": str(chat_file(tmp_path, fmt)),
        "memory_ceiling": "8GiB",
        "max_global_batch": 16,  # the corpus's 120 rows hold a global batch of 16
        "work_dir": str(tmp_path / "runs"),
    }
    return SearchOptions(**{**settings, **changes})


def test_chat_rows_train_under_sfttrainer_with_the_llm_space_and_the_synthetic_tokenizer(tmp_path):
    pytest.importorskip("trl")
    prepared = prepare_request(sft_options(tmp_path), 16 * GiB)
    workload = prepared.request.workload
    assert (workload.trainer, workload.loss_on) == ("sft", "all")
    assert workload.model.fused_lm_head and workload.dataset.column == "messages"
    assert prepared.request.space.source.endswith("llm.yaml")
    notes = "\n".join(prepared.notes)
    assert "trainer: TRL's SFTTrainer on your rows" in notes and "search space: search_spaces/llm.yaml" in notes
    assert "the synthetic word-level tokenizer tokenizes" in notes
    identity = prepared.request.identity()
    assert identity["trainer"] == "sft" and identity["loss_on"] == "all"
    pairs = prepare_request(sft_options(tmp_path, "prompt-completion"), 16 * GiB).request.workload
    assert pairs.loss_on == "completion"  # TRL's default on prompt/completion rows


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"loss_on": "completion"}, "--loss-on completion needs prompt and completion columns"),
        ({"packing": True}, "under --trainer sft TRL packs"),
        ({"model": "bert-tiny"}, "--trainer sft trains causal language models"),
        (
            {"trainer": "trainer", "loss_on": "all"},
            "--loss-on chooses SFTTrainer's loss; --trainer trainer trains with the transformers Trainer",
        ),
    ],
)
def test_what_sft_cannot_train_is_refused_before_any_trial(tmp_path, changes, message):
    pytest.importorskip("trl")
    with pytest.raises(AutotuneError, match=message):
        options_given = sft_options(tmp_path, **changes)
        options_given.check()
        prepare_request(options_given, 16 * GiB)


def test_a_study_of_one_trainer_is_not_resumed_under_the_other(tmp_path, sqlite_url):
    """The same model, rows and length under the Trainer: refused, naming the trainer."""
    pytest.importorskip("trl")
    from autotune.storage import open_storage
    from autotune.study import open_study

    under_sft = prepare_request(sft_options(tmp_path, "text", trainer="sft"), 16 * GiB).request
    open_study(open_storage(sqlite_url), "chat", under_sft)
    assert under_sft.workload.trainer == "sft"
    under_trainer = dataclasses.replace(
        under_sft, workload=dataclasses.replace(under_sft.workload, trainer="trainer", loss_on="all")
    )
    with pytest.raises(AutotuneError, match="another setup \\(trainer 'sft' there, None here"):
        open_study(open_storage(sqlite_url), "chat", under_trainer)
