"""Search spaces: YAML -> checked against the levers -> narrowed to what the device, model and data run.

``_space_file`` reads and checks the file (one key per lever of ``autotune.levers``), ``_narrow`` applies
the levers' filters and rules, ``_search_space`` is the result the study samples from. :func:`load_space`
is the one call that does all three, in the order search_spaces/README.md lists.
"""

from __future__ import annotations

import os
from importlib import resources
from typing import Any

from autotune.errors import AutotuneError
from autotune.estimate import MemoryFit
from autotune.levers import LEVERS
from autotune.space._narrow import (
    PriorPredictions,
    apply_base_args,
    constrain_global_batch,
    filter_combinations,
    filter_for_data,
    filter_for_device,
    filter_for_model,
    filter_for_trainer,
    narrow_by_memory,
    tensor_core_note,
)
from autotune.space._search_space import SearchSpace
from autotune.space._space_file import read_space_file
from autotune.spec.devices import DeviceSpec
from autotune.spec.models import ModelSpec

__all__ = ["DEFAULT_SPACES", "FALLBACK_SPACE", "SearchSpace", "default_space_path", "load_space"]


# The default space of each task (``ModelSpec.task``): a causal LM (a decoder LLM, trained by the
# Trainer or by TRL's SFTTrainer) gets the LLM space; every other task, and no model, the default one.
DEFAULT_SPACES = {"causal-lm": "llm.yaml"}
FALLBACK_SPACE = "default.yaml"


def default_space_path(task: str | None = None) -> str:
    """The default search space's YAML for a model trained as ``task`` (:data:`DEFAULT_SPACES`, else
    :data:`FALLBACK_SPACE`): the repository's ``search_spaces/`` when autotune runs from a source tree
    (``PYTHONPATH=repo``, or an editable install), else the installed package's copy,
    ``autotune.spaces``, which exists only through pyproject's ``package-dir`` mapping."""
    name = DEFAULT_SPACES.get(task or "", FALLBACK_SPACE)
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # autotune/
    source_tree = os.path.join(os.path.dirname(package_dir), "search_spaces", name)
    if os.path.isfile(source_tree):
        return source_tree
    return str(resources.files("autotune.spaces").joinpath(name))


def load_space(
    path: str | None,
    device: DeviceSpec,
    *,
    model: ModelSpec | None = None,
    base_args: dict[str, Any] | None = None,
    global_batch: int | None = None,
    max_global_batch: int | None = None,
    real_data: bool = False,
    packing: bool = False,
    seq_len: int | None = None,
    ceiling_bytes: int | None = None,
    memory_fit: MemoryFit | None = None,
    ranks: int = 1,
    trainer: str = "trainer",
) -> SearchSpace:
    """Read, validate and filter a search space: device, model, data, batch constraint, base arguments.

    Args:
        path: The YAML file; ``None`` for the model's default space (:func:`default_space_path` of its
            task; without a model, :data:`FALLBACK_SPACE`).
        device: Choices it cannot run are removed, with a note.
        model: If given, choices its architecture cannot use are removed.
        base_args: TrainingArguments the user fixed: the levers they set are fixed to match.
        global_batch: ``--global-batch``: only micro-batch x accumulation = this (overrides the YAML).
        max_global_batch: ``--max-global-batch``: micro-batch x accumulation at most this.
        real_data: ``--dataset`` was given: samples have different lengths.
        packing: ``--packing``: every sample is a full block.
        seq_len: Tokens per sample: with it, a note where a micro-batch's tokens are not 8-aligned.
        ceiling_bytes: With ``model``, ``seq_len`` and ``memory_fit`` (the memory prior), the levers
            left at ``auto`` are narrowed by what the prior predicts (``Lever.narrow_auto``: ZeRO only
            where nothing fits without it, over the fit's ``ranks``; micro-batches below 8 only where a
            larger one may not fit, or where ``real_data`` is padded to each batch's longest sample); without
            them ZeRO is off and the micro-batches all stay.
        memory_fit: See ``ceiling_bytes``.
        ranks: ``--devices-per-trial``: the ranks of one trial, which share the global batch.
        trainer: ``--trainer``: choices the trainer does not train are removed, with a note.

    Raises:
        AutotuneError: Unreadable or invalid YAML, or nothing left that can run. (``--global-batch``
            and ``--max-global-batch`` themselves are checked with the other options,
            ``autotune.plan``.)
    """
    path = path or default_space_path(model.task if model is not None else None)
    parsed = read_space_file(path)
    space = filter_for_device(parsed, device, source=path)
    space = filter_for_trainer(space, trainer)
    if model is not None:
        space = filter_for_model(space, model, base_args)
    space = filter_for_data(space, real_data, packing)
    if global_batch is None and max_global_batch is None:
        global_batch, max_global_batch = parsed.global_batch, parsed.max_global_batch
        if global_batch is not None and max_global_batch is not None:
            raise AutotuneError(f"--space {path}: give global_batch or max_global_batch, not both")
    space = constrain_global_batch(space, global_batch, max_global_batch, base_args, ranks)
    space = apply_base_args(space, base_args or {}, device, model)
    memory = (
        PriorPredictions(model, seq_len, memory_fit, ceiling_bytes, lengths_differ=real_data and not packing)
        if model is not None and seq_len is not None and ceiling_bytes is not None and memory_fit is not None
        else None
    )
    # A lever a --base-args field fixes is the user's, whatever auto would keep.
    fixed = {lever.name for lever in LEVERS.values() if any(field in (base_args or {}) for field in lever.fields)}
    space = narrow_by_memory(space, parsed.auto_levers() - fixed, memory)
    # Then: a dtype fixed by --base-args decides which attention kernels can run.
    notes = list(space.notes)
    choices = filter_combinations(space.choices, notes, source=path)
    space = SearchSpace(choices=choices, notes=tuple(notes), source=space.source)
    if seq_len is not None:
        space = tensor_core_note(space, seq_len, device)
    return space
