"""The throughput prior reads the user's data: with ``--dataset`` every prepared row's tokens, as its TRL
trainer tokenizes them, set the typical micro-batch (padding to the longest, or packing), so padded and
packed batching are told apart before any trial (issue 40, point 1: "taken from the user's data")."""

from __future__ import annotations

import dataclasses
import statistics

import pytest

from autotune.estimate import plan_rows
from autotune.levers import TrialConfig
from autotune.plan import EstimateOptions, plan
from autotune.trainers import write_corpus

GiB = 1024**3
SEQ_LEN = 256


def planned_on(path, fmt: str, samples: int = 48):
    tokens = write_corpus(str(path), samples, seed=0, fmt=fmt, length_scale=0.125)
    options = EstimateOptions(model="llama-tiny", dataset=str(path), seq_len=SEQ_LEN, device="cpu", max_global_batch=16)
    return plan(options, 64 * GiB), tokens, samples


def predicted_real_tokens_per_s(workload, **levers) -> float:
    """The workload's throughput prior for micro-batch 8 with ``levers``: its real tokens/s."""
    estimate = workload.speed_model().estimate(workload.model, TrialConfig(micro_batch=8, **levers), SEQ_LEN)
    assert estimate is not None
    return estimate.tokens_per_s


def test_every_chat_row_has_its_tokens_as_sfttrainer_makes_them(tmp_path):
    planned, tokens, rows = planned_on(tmp_path / "chat.jsonl", "messages")
    lengths = planned.workload.dataset.token_lengths
    # Every row prepared (fewer than the space's rows), and their tokens the corpus's own count (ChatML).
    assert len(lengths) == rows and sum(lengths) == tokens


def test_every_pair_has_its_two_rows_as_dpotrainer_batches_them(tmp_path):
    planned, tokens, pairs = planned_on(tmp_path / "prefs.jsonl", "preference")
    lengths = planned.workload.dataset.token_lengths
    assert len(lengths) == 2 * pairs  # prompt + chosen, prompt + rejected
    # The prompt twice and both answers: the corpus's own count of the tokens a DPO step reads.
    assert sum(lengths) == tokens


def test_on_short_rows_packing_is_predicted_faster_than_padding_to_the_longest(tmp_path):
    planned, _, _ = planned_on(tmp_path / "chat.jsonl", "messages")
    workload = planned.workload
    assert statistics.median(workload.dataset.token_lengths) < SEQ_LEN / 2  # most rows far shorter: padding pads
    # Padded rows compute their padding, which is not real work; packed ones compute only real tokens.
    # (Read as every row SEQ_LEN tokens long, the prior put padding ahead: 67,878 against 54,192.)
    assert predicted_real_tokens_per_s(workload, packing="bfd") > predicted_real_tokens_per_s(workload, packing="off")


def test_the_trainers_samples_have_their_tokens_and_padding_to_the_longest_beats_padding_to_seq_len(tmp_path):
    """Under the Trainer (token-id rows, as a tokenized dataset has them): each sample's tokens, and a batch
    padded to its longest sample predicted faster in real tokens/s than one padded to --seq-len."""
    import json
    import random

    draw = random.Random(0)
    lengths = [draw.randint(8, 60) for _ in range(48)]
    data = tmp_path / "ids.jsonl"
    data.write_text("".join(json.dumps({"input_ids": [5] * n}) + "\n" for n in lengths))
    options = EstimateOptions(model="gpt2-tiny", dataset=str(data), seq_len=SEQ_LEN, device="cpu", max_global_batch=16)
    workload = plan(options, 64 * GiB).workload
    assert sorted(workload.dataset.token_lengths) == sorted(lengths)
    longest = predicted_real_tokens_per_s(workload, padding="longest")
    assert longest > predicted_real_tokens_per_s(workload, padding="max_length")


def test_a_large_prepared_set_is_read_for_its_lengths_in_a_bounded_sample(tmp_path):
    """Rendering a chat row costs milliseconds: the prior's lengths come from every k-th prepared row, at most
    about LENGTH_ROWS of them, drawn across the whole set (its longest rows as likely as in the set)."""
    from autotune.spec.dataset import LENGTH_ROWS

    path = tmp_path / "chat.jsonl"
    write_corpus(str(path), 1500, seed=0, fmt="messages", length_scale=0.125)
    options = EstimateOptions(
        model="llama-tiny", dataset=str(path), seq_len=SEQ_LEN, device="cpu", max_global_batch=256
    )
    dataset = plan(options, 64 * GiB).workload.dataset
    assert dataset.num_samples == 1500 and 0 < len(dataset.token_lengths) <= LENGTH_ROWS
    assert len(dataset.token_lengths) >= LENGTH_ROWS // 2  # a sample, not a handful


def test_estimate_takes_the_global_batch_its_advice_names_for_a_small_dataset(tmp_path):
    """A --dataset smaller than the space's largest global batch: estimate, as search, says to cap the batch
    with --global-batch, and takes it (it was search's option only: the advice named an option estimate
    refused)."""
    from tests.support.cli import run_cli_in_process

    path = tmp_path / "prefs.jsonl"
    write_corpus(str(path), 24, seed=0, fmt="preference", length_scale=0.125)
    base = ("estimate", "--model", "llama-tiny", "--dataset", str(path), "--seq-len", str(SEQ_LEN), "--device", "cpu")
    refused = run_cli_in_process(*base, cwd=tmp_path)
    assert refused.returncode == 2 and "cap the batch with --global-batch" in refused.stderr
    capped = run_cli_in_process(*base, "--global-batch", "8", "--json", cwd=tmp_path)
    assert capped.returncode == 0, capped.stderr
    import json

    rows = json.loads(capped.stdout)["rows"]
    assert rows and all(row["config"]["micro_batch"] * row["config"]["grad_accum"] == 8 for row in rows)


def test_trls_collators_pad_to_the_batchs_longest_so_a_smaller_micro_batch_computes_less_padding(tmp_path):
    """TRL's own collators pad each micro-batch to its longest row (DataCollatorForPreference,
    DataCollatorForLanguageModeling), and off CUDA TRL's fused head scores every position of that batch:
    on pairs of different lengths a DPO step of micro-batch 1 x accumulation 8 computes fewer tokens than
    one of micro-batch 8 and is predicted faster in real tokens/s (measured 1.71x on the CPU,
    docs/benchmarks.md "DPO on the CPU", run 10). Read as padded to --seq-len, every micro-batch computed
    the same tokens and micro-batch 1 was predicted slower (0.92x)."""
    from autotune.estimate import step_work

    planned, _, _ = planned_on(tmp_path / "prefs.jsonl", "preference")
    workload = planned.workload
    assert workload.model.pads_to_longest
    speed = workload.speed_model()

    def work(micro: int):
        return speed.work(workload.model, TrialConfig(micro_batch=micro, grad_accum=8 // micro), SEQ_LEN)

    one, eight = work(1), work(8)
    assert one.real_tokens == eight.real_tokens  # the same rows, the same real tokens per step
    assert one.matmul_flops + one.fp32_matmul_flops < eight.matmul_flops + eight.fp32_matmul_flops
    assert one.memory_bytes < eight.memory_bytes  # the head's passes over fewer padded positions
    faster = [speed.estimate(workload.model, TrialConfig(micro_batch=m, grad_accum=8 // m), SEQ_LEN) for m in (1, 8)]
    assert faster[0] is not None and faster[1] is not None and faster[0].tokens_per_s > faster[1].tokens_per_s
    # The Trainer's own loader pads every sample to --seq-len: there the micro-batch moves no padding.
    padded = dataclasses.replace(workload.model, pads_to_longest=False)
    lengths = workload.dataset.token_lengths
    by_micro = [
        step_work(padded, TrialConfig(micro_batch=m, grad_accum=8 // m), SEQ_LEN, "cpu", "bf16", lengths)
        for m in (1, 8)
    ]
    assert (
        by_micro[0].matmul_flops + by_micro[0].fp32_matmul_flops
        == by_micro[1].matmul_flops + by_micro[1].fp32_matmul_flops
    )


def test_a_precomputed_reference_pass_is_predicted_and_counted_over_the_run_as_a_trial_counts_it(tmp_path):
    """DPO's ``precompute_ref_log_probs`` runs the reference's forward over every pair once, before training
    (trl/trainer/dpo_trainer.py, ``_precompute_ref_logps``), in micro-batches of the training's size. A trial
    times that pass and counts it over the user's run (``over_the_run``); the prior predicts it and counts it
    the same, so a precomputing config is not predicted faster by the pass it does not count, and the
    predicted run time adds it once."""
    from autotune.result import duration, over_the_run
    from autotune.views.run_time import predicted_run_time

    path = tmp_path / "prefs.jsonl"
    write_corpus(str(path), 48, seed=0, fmt="preference", length_scale=0.125)
    rates = {}
    for epochs in (1.0, 3.0):
        options = EstimateOptions(
            model="llama-tiny", dataset=str(path), seq_len=SEQ_LEN, device="cpu", max_global_batch=16, epochs=epochs
        )
        workload = plan(options, 64 * GiB).workload
        speed = workload.speed_model()
        each_step = speed.estimate(workload.model, TrialConfig(micro_batch=8), SEQ_LEN)
        precomputed = speed.estimate(workload.model, TrialConfig(micro_batch=8, precompute_ref_log_probs=True), SEQ_LEN)
        assert each_step is not None and precomputed is not None
        # The pass computes, a pair, the reference's forward that each step otherwise computes for it.
        per_pair_in_steps = (each_step.work.matmul_flops - precomputed.work.matmul_flops) / each_step.work.samples
        assert precomputed.work.setup_matmul_flops_per_sample == pytest.approx(per_pair_in_steps)
        assert each_step.setup_s_per_sample == 0 and each_step.samples_per_s == each_step.steady_samples_per_s
        assert precomputed.setup_s_per_sample > 0 and precomputed.work.run_passes == epochs
        assert precomputed.samples_per_s == pytest.approx(
            over_the_run(precomputed.steady_samples_per_s, precomputed.setup_s_per_sample, epochs)
        )
        assert precomputed.tokens_per_s < precomputed.work.real_tokens / precomputed.step_s
        rates[epochs] = precomputed.samples_per_s
        config = TrialConfig(micro_batch=8, precompute_ref_log_probs=True)
        line = predicted_run_time({}, epochs, 48, (config, precomputed), None, None, 1, "dpo")
        seconds = 48 * epochs / precomputed.steady_samples_per_s + 48 * precomputed.setup_s_per_sample
        assert line is not None and f": {duration(seconds)} (predicted winner" in line
    assert rates[1.0] < rates[3.0]  # the pass weighs more on a shorter run


def test_the_predicted_run_time_compares_no_default_that_does_not_fit(tmp_path):
    """Qwen2.5-0.5B under a 6 GiB ceiling: the HF default (fp32 weights and AdamW states, 16 bytes a parameter) cannot
    start, so its time is not set against the winner's; the line says why. Under a ceiling it fits, it is compared."""
    from autotune.study import default_config
    from autotune.views.run_time import predicted_run_time_of

    path = tmp_path / "chat.jsonl"
    write_corpus(str(path), 32, seed=0, fmt="messages", length_scale=0.125)
    for ceiling, compared in ((6 * GiB, False), (64 * GiB, True)):
        options = EstimateOptions(
            model="qwen2.5-0.5b", dataset=str(path), seq_len=SEQ_LEN, device="cpu", epochs=1.0, max_global_batch=16
        )
        planned = plan(options, 64 * GiB)
        workload = dataclasses.replace(planned.workload, ceiling_bytes=ceiling)
        planned = dataclasses.replace(planned, workload=workload)
        speed, fit = workload.speed_model(), planned.prior
        rows = plan_rows(workload.model, planned.space.choices, SEQ_LEN, fit, ceiling, speed)
        line = predicted_run_time_of(planned, rows, speed, options, default_config(workload.trainer), fit)
        assert line is not None and "(predicted winner" in line
        assert ("is not compared: its predicted peak" in line) is not compared
        assert (" vs " in line) is compared


def test_a_dpo_plan_reads_whether_dropout_is_switched_off_from_the_users_base_args(tmp_path):
    """DPOTrainer switches gpt2-tiny's dropout modules off by default (``disable_dropout``), not with
    ``disable_dropout: false`` in ``--base-args``: the plan's model says which, and the prior's dropout part
    follows it."""
    import json

    data = tmp_path / "prefs.jsonl"
    write_corpus(str(data), 16, seed=0, fmt="preference", length_scale=0.125)
    kept = tmp_path / "kept.json"
    kept.write_text(json.dumps({"disable_dropout": False}))

    def planned(base_args: str | None):
        options = EstimateOptions(
            model="gpt2-tiny", dataset=str(data), seq_len=64, device="cpu", max_global_batch=8, base_args=base_args
        )
        workload = plan(options, 64 * GiB).workload
        estimate = workload.speed_model().estimate(workload.model, TrialConfig(micro_batch=2), 64)
        assert estimate is not None
        return workload.model.dropout_modules_off, estimate.parts()["dropout"]

    assert planned(None) == (True, 0.0)
    off, dropout_s = planned(str(kept))
    assert not off and dropout_s > 0


def test_estimates_table_gives_each_settings_fastest_micro_batch_and_its_first_row_is_the_predicted_winner(tmp_path):
    """On pairs of different lengths TRL pads a batch to its longest, so a setting's largest micro-batch that
    fits is not its fastest. ``autotune estimate``'s table names each setting's fastest micro-batch and gives
    its predicted speed, the settings ordered by it, so its first row holds the predicted winner. (Its speed
    columns were the largest micro-batch's: the winner line named a config faster than every row.)"""
    from tests.support.cli import run_cli_in_process

    path = tmp_path / "prefs.jsonl"
    write_corpus(str(path), 48, seed=0, fmt="preference", length_scale=0.125)
    out = run_cli_in_process(
        *("estimate", "--model", "llama-tiny", "--dataset", str(path), "--seq-len", str(SEQ_LEN)),
        *("--device", "cpu", "--max-global-batch", "16"),
        cwd=tmp_path,
        env={"COLUMNS": "400"},
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    header = next(line for line in lines if line.startswith("┃"))
    column = {name.strip(): index for index, name in enumerate(header.split("┃"))}
    rows = [line.split("│") for line in lines if line.startswith("│")]
    fitting = [cells for cells in rows if cells[column["vs ceiling"]].strip() == "fits"]
    assert len(fitting) > 1
    largest = [int(cells[column["largest micro-batch"]]) for cells in fitting]
    fastest = [int(cells[column["fastest micro-batch"]]) for cells in fitting]
    assert all(f <= big for f, big in zip(fastest, largest)) and any(f < big for f, big in zip(fastest, largest))
    tokens = [float(cells[column["tokens/s"]].replace(",", "")) for cells in fitting]
    tflops = [float(cells[column["model TFLOPs"]]) for cells in fitting]
    assert tflops == sorted(tflops, reverse=True)
    winner = next(line for line in lines if line.startswith("predicted winner: "))
    assert winner.startswith(f"predicted winner: mb={fastest[0]} ") and f" {tokens[0]:,.0f} tokens/s" in winner


def test_bfd_rows_are_the_rows_trls_own_packing_makes():
    """The prior packs the user's rows as TRL does (trl.pack_dataset, bfd: best fit decreasing within each map
    batch of 1,000 rows, every row truncated): the same mean row length and samples a row, on short rows that fill
    rows, long ones that pack one to a row, a few that make one short row, and more rows than one map batch."""
    import random

    import datasets
    from trl import pack_dataset

    from autotune.estimate._packing import bfd_rows

    rng = random.Random(0)
    cases = {
        "short": [rng.randint(20, 300) for _ in range(400)],
        "long": [rng.randint(1100, 3000) for _ in range(60)],
        "few": [100] * 8,
        "two map batches": [rng.randint(5, 300) for _ in range(1300)],
    }
    for name, lengths in cases.items():
        rows = datasets.Dataset.from_dict({"input_ids": [[1] * n for n in lengths]})
        packed = pack_dataset(rows, seq_length=2048, strategy="bfd")
        tokens = [len(ids) for ids in packed["input_ids"]]
        trl = (sum(tokens) / len(tokens), len(lengths) / len(tokens))
        assert bfd_rows(tuple(lengths), 2048) == pytest.approx(trl), name
    # Where short samples fill the rows, a row is nearly full: the prior's rows before it counted every row full.
    assert bfd_rows(tuple(cases["short"]), 2048)[0] > 0.95 * 2048
    assert bfd_rows(tuple(cases["few"]), 2048) == (800.0, 8.0)
