"""Every lever is one entry of ``autotune.levers``, and every part of autotune knows the same levers.

A lever known to one part (the space, the mapping, the estimator, the export, the docs) and not
another fails here: adding a lever is one entry plus its tests.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import typing
from pathlib import Path

import pytest
from pydantic import StrictBool, StrictInt, StrictStr

from autotune import trainers
from autotune.estimate import MemoryFit, estimate_peak
from autotune.levers import (
    BATCH_LIMITS,
    LEVERS,
    NARROWED_BY_MEMORY,
    Lever,
    TrialConfig,
    lever_values_from_base_args,
    training_arguments_kwargs,
)
from autotune.levers._exports import TOOL_FORMS, CannotExpress
from autotune.levers._lever import ACTS_ON, MEMORY_PARTS
from autotune.space._space_file import AUTO, SpaceFile
from autotune.spec.models import ModelSpec

REPO = Path(__file__).resolve().parent.parent.parent
# pin_memory is forced off on every CPU config: a label would repeat on every row of a CPU study.
UNLABELLED = {"pin_memory"}


def other_values(lever: Lever) -> list:
    """Values of the lever other than its default, to try."""
    if lever.choices is not None:
        return [v for v in lever.choices if v != lever.default]
    if lever.value_type is bool:
        return [not lever.default]
    return [lever.default + 2, lever.default + 16]


STRICT = {int: StrictInt, bool: StrictBool, str: StrictStr}


def test_trial_config_has_one_field_per_lever_with_its_type_and_default():
    """TrialConfig is written out (an IDE reads it); its fields cannot drift from LEVERS."""
    hints = typing.get_type_hints(TrialConfig)
    assert [f.name for f in dataclasses.fields(TrialConfig)] == list(LEVERS)
    for field in dataclasses.fields(TrialConfig):
        lever = LEVERS[field.name]
        assert field.default == lever.default, field.name
        expected = lever.value_type if lever.default is not None else lever.value_type | None
        assert hints[field.name] == expected, field.name


def space_file_field(lever: Lever) -> tuple[object, object]:
    """What a lever's YAML key accepts and means when left out: a list of strictly typed choices, or
    ``auto`` where the lever has an ``auto`` list (left out: ``auto``, or the default alone where
    ``absent_means_auto`` is off); else left out is the default
    alone (a lever in every space) or nothing (the model's or the Trainer's own behaviour)."""
    choices = list[STRICT[lever.value_type]]
    if lever.auto_choices is not None:
        return choices | StrictStr, AUTO if lever.absent_means_auto else [lever.default]
    if lever.in_every_space:
        return choices, [lever.default]
    return choices | None, None


def test_the_space_file_has_one_field_per_lever_with_its_type_and_default():
    """SpaceFile is written out too; each field is what its lever says a space may write."""
    assert list(SpaceFile.model_fields) == [*LEVERS, *BATCH_LIMITS, "leave_out_slow"]
    for name, lever in LEVERS.items():
        field = SpaceFile.model_fields[name]
        assert (field.annotation, field.default) == space_file_field(lever), name
    for limit in BATCH_LIMITS:
        assert (SpaceFile.model_fields[limit].annotation, SpaceFile.model_fields[limit].default) == (
            StrictInt | None,
            None,
        )


def test_each_lever_has_the_hooks_its_declarations_promise():
    for name, lever in LEVERS.items():
        assert lever.acts_on in ACTS_ON, name
        assert (lever.memory is not None) == bool(lever.memory_parts), f"{name}: memory parts need a memory hook"
    assert {lever.name for lever in NARROWED_BY_MEMORY} == {
        name for name, lever in LEVERS.items() if lever.narrow_auto is not None
    }


@pytest.mark.parametrize("name", list(LEVERS))
def test_the_mapping_writes_only_the_levers_fields_and_its_inverse_reads_them_back(name):
    lever = LEVERS[name]
    for value in [lever.default, *other_values(lever)]:
        written = lever.to_training_args(value)
        assert set(written) <= set(lever.fields), (value, written)
        if lever.acts_on != "training_args":
            assert written == {} and lever.from_training_args is None
            continue
        if written:  # a value that writes nothing is the Trainer's default, which the inverse never sees
            assert lever_values_from_base_args(written) == {name: value}


@pytest.mark.parametrize("name", list(LEVERS))
def test_the_whole_mapping_carries_each_levers_value(name):
    lever = LEVERS[name]
    for value in other_values(lever):
        config = TrialConfig(**{name: value})
        kwargs = training_arguments_kwargs(config, "cuda")
        expected = lever.to_training_args(value)
        assert {k: kwargs[k] for k in expected} == expected


@pytest.mark.parametrize("name", list(LEVERS))
def test_every_value_other_than_the_default_is_named_in_tables_and_the_export(name):
    lever = LEVERS[name]
    for value in other_values(lever):
        config = TrialConfig(**{name: value})
        if name not in UNLABELLED:
            assert config.short() != TrialConfig().short(), value
        if lever.acts_on != "training_args":
            assert lever.export_note(value), f"{name} {value}: the export must say how to apply it"
    assert lever.export_note(lever.default) == ""


def trained_by_its_trainer(lever: Lever, model: ModelSpec) -> ModelSpec:
    """``model`` as the first trainer that runs every value of ``lever`` trains it (``autotune.trainers``):
    a lever of one trainer's (``precompute_ref_log_probs``: DPOTrainer's reference) acts on its model."""
    kind = next(
        k
        for k in trainers.REGISTERED
        if not any(lever.unavailable_with_trainer(v, k.name) for v in other_values(lever))
    )
    return trainers.with_model(model, kind)


@pytest.mark.parametrize("device_kind", ["cpu", "cuda"])
@pytest.mark.parametrize("name", list(LEVERS))
def test_a_lever_changes_the_estimate_exactly_where_it_says(name, device_kind, gpt2_tiny):
    """A lever with memory parts moves the estimate on its device kinds, only in those parts (the
    CUDA allocator's share follows whatever moves); a lever without moves nothing. The model is the one
    the lever's trainer trains (a reference copy beside it under DPO)."""
    lever = LEVERS[name]
    assert set(lever.memory_parts) <= set(MEMORY_PARTS)
    model = trained_by_its_trainer(lever, gpt2_tiny)
    fit = MemoryFit.prior(device_kind)
    lengths = [120, 40, 30, 20]  # real samples, so that padding can matter
    base = TrialConfig(micro_batch=4, pin_memory=False)
    before = estimate_peak(model, base, 128, fit, lengths=lengths).parts()
    changed: set[str] = set()
    for value in other_values(lever):
        after = estimate_peak(model, dataclasses.replace(base, **{name: value}), 128, fit, lengths=lengths).parts()
        changed |= {part for part in before if after[part] != before[part]}
    if lever.changes_memory_on(device_kind):
        assert changed, f"{name} declares {lever.memory_parts} but moves nothing on {device_kind}"
        assert changed <= {*lever.memory_parts, "allocator"}, changed
    else:
        assert not changed, f"{name} moves {changed} on {device_kind} but declares no memory part there"


def test_the_space_readme_documents_every_lever():
    readme = (REPO / "search_spaces" / "README.md").read_text()
    documented = set(re.findall(r"^\| `(\w+)` \|", readme, flags=re.MULTILINE))
    assert set(LEVERS) <= documented, set(LEVERS) - documented


# --- no module outside autotune/levers/ reads a lever by name ---------------------------------------

PACKAGE = REPO / "autotune"
LEVERS_FOLDER = PACKAGE / "levers"
# Lever names that are also a library's words: torch's and numpy's ``dtype`` (a tensor's attribute, a
# keyword of every tensor factory) and ``compile`` (``re.compile``, ``torch.compile``). An attribute or
# a keyword by these names is read as a lever only on a trial config (an expression whose last name
# ends in ``config``: ``config.dtype``, ``job.config.dtype``, ``TrialConfig(dtype=...)``); elsewhere it
# is the library's. ``packing`` is also the ``--packing`` option (the Trainer path's own packing of
# documents into blocks: ``PlanOptions.packing``, ``PreparedDataset.packing``), read the same way. Every
# other lever name is an offence wherever it is read. ``padding`` is also Rich's (a table's cell padding), read the
# same way.
LIBRARY_WORDS = {"dtype", "compile", "packing", "padding"}
# The only places outside autotune/levers/ that may spell a lever's name, each with why it is not a
# lever's rule read by name. (TrialConfig's own definition, its roles such as ``global_batch`` and the
# loops over the levers' hooks live in autotune/levers/; the space file's schema spells every lever as
# a field, which this check does not count, and tests/levers/test_lever_home.py checks it against LEVERS.)
ALLOWED = {
    # from_config's own keyword: the torch dtype the weights are built in (the weight_dtype lever sets it
    # through its to_model_build hook; build_model passes float32 where no lever does).
    ("autotune/spec/building.py", "dtype"),
    # A datasets Feature's dtype ("string", "int64"): which column holds the text or the token ids.
    ("autotune/spec/dataset_files.py", "dtype"),
    # The keys of SFTConfig and of its model_init_kwargs that the SFT export translates into other tools'
    # keys (trl sft flags, axolotl, LLaMA-Factory): the arguments' fields, written by the levers' own
    # to_training_args / to_model_build; the export reads them, never a lever.
    *(("autotune/views/sft_export.py", name) for name in ("dtype", "attn_implementation")),
    # The fields SFTTrainer's exports write even at TRL's default (its ToolExport.written_fields): data on the
    # trainer that the export reads, never a lever's rule.
    ("autotune/trainers/sft.py", "packing"),
    *(("autotune/views/sft_tool_yaml.py", name) for name in ("dtype", "attn_implementation")),
}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _last_name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call):
        return _last_name(node.func)
    return ""


def lever_reads(source: str, names: set[str]) -> list[tuple[int, str]]:
    """Where ``source`` names a lever: ``x.zero``, ``params["zero"]`` (any string constant but a
    docstring), ``replace(config, zero=...)``; for :data:`LIBRARY_WORDS`, only on a trial config. An
    attribute of an imported module (``torch.compile``) is never a lever."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    modules = {
        (alias.asname or alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in names:
            if isinstance(node.value, ast.Name) and node.value.id in modules:
                continue
            if node.attr in LIBRARY_WORDS and not _last_name(node.value).lower().endswith("config"):
                continue
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg not in names:
                    continue
                if keyword.arg in LIBRARY_WORDS and _last_name(node.func) not in ("TrialConfig", "replace"):
                    continue
                found.append((keyword.value.lineno, keyword.arg))
        elif isinstance(node, ast.Constant) and node.value in names and id(node) not in docstrings:
            found.append((node.lineno, node.value))
    return found


def outside_levers() -> list[Path]:
    return [path for path in sorted(PACKAGE.rglob("*.py")) if LEVERS_FOLDER not in path.parents]


def test_no_module_outside_the_levers_reads_a_lever_by_name():
    """A lever's rules live in its own module: the estimator, the child, the space, the seeds and the
    views read a lever through its hooks (MemoryTraits, the model build, Batching, TrainerParts, the
    mapping) or through TrialConfig's roles, never by its name."""
    offences = []
    for path in outside_levers():
        relative = str(path.relative_to(REPO))
        for line, name in lever_reads(path.read_text(), set(LEVERS)):
            if (relative, name) not in ALLOWED:
                offences.append(f"{relative}:{line} reads the lever {name!r} by name")
    assert offences == [], "\n".join(offences)


def test_the_check_sees_each_way_of_reading_a_lever():
    source = '''
import torch
import re


def f(config, job, params, best_config):
    """Mentions zero and micro_batch in prose, which is no read."""
    a = config.zero
    b = params["micro_batch"]
    c = dataclasses.replace(config, checkpointing=True)
    d = job.config.dtype
    e = TrialConfig(dtype="bf16")
    g = best_config.compile
    return torch.zeros(3, dtype=torch.float32), x.dtype, torch.compile, re.compile("x"), tensor.dtype
'''
    assert sorted(lever_reads(source, set(LEVERS))) == [
        (8, "zero"),
        (9, "micro_batch"),
        (10, "checkpointing"),
        (11, "dtype"),
        (12, "dtype"),
        (13, "compile"),
    ]


def test_every_allowed_place_still_names_its_lever():
    """An allow-list entry no module needs any more is removed, so the list stays the places that do."""
    for relative, name in ALLOWED:
        reads = [found for _, found in lever_reads((REPO / relative).read_text(), set(LEVERS))]
        assert name in reads, f"{relative} no longer names {name!r}: remove it from ALLOWED"


# --- every lever says its fields in every export form, and no other module spells them --------------


def test_every_lever_declares_each_of_its_fields_in_every_tool_form():
    """axolotl and LLaMA-Factory rename the arguments' fields: each lever declares, for each of its
    fields, the tool's keys or why the tool cannot express it (``Lever.tool_keys``), so a new lever's
    field never becomes "not expressible" unsaid."""
    for name, lever in LEVERS.items():
        assert set(lever.tool_keys) <= set(TOOL_FORMS), name
        for tool in TOOL_FORMS:
            declared = set(lever.tool_keys.get(tool, {}))
            assert declared == set(lever.fields), f"{name}: {tool} declares {sorted(declared)}, not {lever.fields}"


def test_a_field_a_tool_cannot_express_is_said_with_why():
    said = CannotExpress("axolotl has no key for it")(True, {})
    assert said == ({}, ["axolotl has no key for it"])


def test_the_argument_forms_take_every_lever_field_by_its_own_name():
    """The JSON, flag and Python forms write the arguments class's own fields, and ``trl sft`` / ``trl dpo``
    parse every one of them (trl/scripts/sft.py, dpo.py: HfArgumentParser over SFTConfig, DPOConfig): a
    lever's ``fields`` are its keys there, so each must be a field of the class of every trainer that runs it."""
    pytest.importorskip("trl")
    import importlib

    missing = {}
    for kind in (k for k in trainers.REGISTERED if "trl" in k.tool_forms):
        parser = importlib.import_module(f"trl.scripts.{kind.name}").make_parser()
        flags = {action.dest for action in parser._actions if f"--{action.dest}" in action.option_strings}
        runs = [
            lever
            for lever in LEVERS.values()
            if not all(lever.unavailable_with_trainer(v, kind.name) for v in other_values(lever))
        ]
        missing[kind.name] = sorted({field for lever in runs for field in lever.fields} - flags)
    assert missing == {"sft": [], "dpo": []}, f"lever fields `trl <trainer>` has no flag for: {missing}"


# The names bf16, fp16 and tf32 are a precision's as well as TrainingArguments fields (the dtype lever's
# values, a device's dtypes, the peak a trial ran at): outside views/ they are read as precisions; in
# views/, where only arguments are rendered, as fields.
PRECISION_NAMES = {"bf16", "fp16", "tf32"}
# The only places outside autotune/levers/ that spell a lever's arguments field, each with why it is not an
# export form's rule for a lever field (which is the lever's: ``fields``, ``tool_keys``).
_BASE_ARGS_CHECKS = (
    "--base-args checks the user's own value of the field (its DeepSpeed config, its backend, its batch)"
)
ALLOWED_FIELDS = {
    **{
        ("autotune/plan/_base_args.py", field): _BASE_ARGS_CHECKS
        for field in (
            "deepspeed",
            "torch_compile_backend",
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
        )
    },
    ("autotune/runner/_baseline.py", "deepspeed"): "the library's name (its import time is measured)",
    ("autotune/runner/_cpu_deepspeed.py", "deepspeed"): "the library's name (imported among the preloads)",
    ("autotune/runner/_measured.py", "deepspeed"): "the library's distribution name (its version recorded)",
    ("autotune/runner/_side_effects.py", "deepspeed"): "the trial's DeepSpeed config, its monitors turned off",
    ("autotune/runner/_trial.py", "per_device_train_batch_size"): "the built arguments read back in the child",
    ("autotune/runner/_loss_recorder.py", "gradient_accumulation_steps"): "the built arguments read back in the child",
    ("autotune/runner/_loader.py", "max_length"): "the tokenizer's own keyword (truncation to --seq-len)",
    ("autotune/spec/sft.py", "max_length"): "the SFT trainer's own field: --seq-len, unless a lever sets it",
    ("autotune/trainers/sft.py", "max_length"): "the SFT trainer's own field, refused in --base-args",
    ("autotune/trainers/dpo.py", "max_length"): "the DPO trainer's own field (--seq-len), refused in --base-args",
    ("autotune/trainers/sft.py", "padding_free"): "TRL's collator's keyword, the collator the packing lever probes",
    ("autotune/views/export.py", "deepspeed"): "the DeepSpeed config written beside the export, named by path",
    ("autotune/views/export.py", "tf32"): "the precision that ran made explicit (with_precision_that_ran)",
    # The resolution of the fields whose defaults differ from TrainingArguments' (bf16 follows fp16).
    **{
        ("autotune/views/sft_export.py", field): "SFTConfig's and DPOConfig's defaults resolved as they resolve them"
        for field in ("bf16", "fp16", "gradient_checkpointing", "activation_checkpointing")
    },
    ("autotune/trainers/sft.py", "packing"): "the batching fields SFTTrainer's exports write even at TRL's default",
    # axolotl's weights' dtype follows bf16/fp16 (the model build's mapper, which no single lever owns).
    **{("autotune/views/sft_tool_yaml.py", field): "the weights' dtype under autocast" for field in ("bf16", "fp16")},
    # The accelerate config: what of the arguments an accelerate launch config can carry.
    **{
        ("autotune/views/trainer_formats.py", field): "the accelerate form (not yet a lever declaration)"
        for field in (
            "bf16",
            "fp16",
            "tf32",
            "torch_compile",
            "torch_compile_backend",
            "torch_compile_mode",
            "deepspeed",
            "gradient_accumulation_steps",
        )
    },
}


def field_spellings() -> list[tuple[str, int, str]]:
    fields = {field for lever in LEVERS.values() for field in lever.fields}
    found = []
    for path in outside_levers():
        relative = str(path.relative_to(REPO))
        names = fields if relative.startswith("autotune/views/") else fields - PRECISION_NAMES
        found += [(relative, line, name) for line, name in lever_reads(path.read_text(), names)]
    return found


def test_no_module_outside_the_levers_spells_a_levers_field():
    """A lever's fields are said by the lever, in every form: the views read ``fields`` and ``tool_keys``."""
    offences = [
        f"{relative}:{line} spells the lever field {name!r}"
        for relative, line, name in field_spellings()
        if (relative, name) not in ALLOWED_FIELDS
    ]
    assert offences == [], "\n".join(offences)


def test_every_allowed_field_place_still_spells_it():
    spelled = {(relative, name) for relative, _, name in field_spellings()}
    stale = set(ALLOWED_FIELDS) - spelled
    assert stale == set(), f"no longer spelled (remove from ALLOWED_FIELDS): {sorted(stale)}"
