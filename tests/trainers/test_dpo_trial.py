"""A ``--trainer dpo`` trial under ``--peft lora`` through the runner (autotune/runner/_trial.py): the child
builds the base model unwrapped and hands DPOTrainer the adapters as ``peft_config`` (``applies_adapters``), as
``trl dpo --use_peft`` does, so the model that trains holds the one adapter TRL made (no copy of it as a
reference: TRL disables the adapters for the reference's forward)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("trl")

from autotune.levers import TrialConfig
from autotune.runner import TrialJob, run_isolated
from tests.support.dpo import dpo_workload
from tests.support.probes import ADAPTERS_FILE


@pytest.mark.slow
def test_a_lora_trial_trains_the_adapters_dpotrainer_applies(tmp_path):
    workload = dpo_workload(tmp_path, peft="lora", callbacks=("tests.support.probes:RecordAdapters",))
    work_dir = tmp_path / "trial"
    result = run_isolated(TrialJob(workload, TrialConfig(micro_batch=4, pin_memory=False), str(work_dir)), 600)
    assert result.status == "ok", result.error
    assert result.runtime["trainer"] == "DPOTrainer" and result.measured_steps >= 1
    adapters = json.loads(Path(work_dir, ADAPTERS_FILE).read_text())
    assert adapters["peft_model"] and adapters["adapters"] == ["default"]  # applied once, by DPOTrainer
    assert 0 < adapters["trainable"] < adapters["total"] / 10  # the adapters train, the base is frozen
