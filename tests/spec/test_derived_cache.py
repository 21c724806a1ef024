"""Figures kept on disk between processes (autotune/spec/derived_cache.py): the same inputs read the
entry, any change computes a new one, and a damaged entry is computed again."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from autotune.spec.derived_cache import cached


@pytest.fixture
def cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "autotune" / "derived"


def test_the_same_key_reads_the_entry_and_another_key_computes_its_own(cache_home):
    calls: list[str] = []

    def compute(value: str):
        calls.append(value)
        return {"figure": value}

    assert cached("figure", {"a": 1}, __file__, lambda: compute("first")) == {"figure": "first"}
    assert cached("figure", {"a": 1}, __file__, lambda: compute("second")) == {"figure": "first"}
    assert cached("figure", {"a": 2}, __file__, lambda: compute("third")) == {"figure": "third"}
    assert calls == ["first", "third"]
    assert len(list(cache_home.glob("figure-*.json"))) == 2


def test_a_changed_rule_is_a_new_entry(cache_home, tmp_path):
    rules = tmp_path / "rules.py"
    rules.write_text("RATE = 1\n")
    assert cached("figure", {}, str(rules), lambda: 1) == 1
    rules.write_text("RATE = 2\n")
    assert cached("figure", {}, str(rules), lambda: 2) == 2


def test_a_rule_changed_in_any_of_its_files_is_a_new_entry(cache_home, tmp_path):
    """A figure whose rules span files (a model's description: spec/models.py and spec/block_layout.py)."""
    first, second = tmp_path / "first.py", tmp_path / "second.py"
    first.write_text("A = 1\n")
    second.write_text("B = 1\n")
    assert cached("figure", {}, (str(first), str(second)), lambda: 1) == 1
    assert cached("figure", {}, (str(first), str(second)), lambda: 9) == 1  # unchanged: read back
    second.write_text("B = 2\n")
    assert cached("figure", {}, (str(first), str(second)), lambda: 2) == 2


def test_a_damaged_entry_is_computed_again_and_a_value_json_cannot_hold_is_not_kept(cache_home):
    assert cached("figure", {}, __file__, lambda: [1, 2]) == [1, 2]
    (entry,) = cache_home.glob("figure-*.json")
    entry.write_text("{not json")
    assert cached("figure", {}, __file__, lambda: [3, 4]) == [3, 4]
    assert json.loads(entry.read_text())["value"] == [3, 4]
    unkept = object()
    assert cached("other", {}, __file__, lambda: unkept) is unkept
    assert not list(cache_home.glob("other-*")) and not list(cache_home.glob("*.tmp"))


def test_a_config_of_another_shape_is_counted_again(cache_home):
    from transformers import AutoConfig

    from autotune.spec.model_catalog import catalog_entry
    from autotune.spec.models import spec_from_config

    values = {k: v for k, v in catalog_entry("bert-tiny").items() if not k.startswith("_autotune")}
    two = spec_from_config("bert-tiny", AutoConfig.for_model(**values), "catalog", None, None)
    values["num_hidden_layers"] = 4
    four = spec_from_config("bert-tiny", AutoConfig.for_model(**values), "catalog", None, None)
    assert four.num_block_params == 2 * two.num_block_params
    assert four.num_params == two.num_params + two.num_block_params
    assert len(list(cache_home.glob("param-counts-*.json"))) == 2


SEARCH_START = (
    "import sys\n"
    "from autotune.spec.models import resolve_model\n"
    "from autotune.study import default_config\n"
    "from autotune.levers import TrialConfig, training_arguments_kwargs\n"
    "spec = resolve_model('bert-tiny')\n"
    "config = default_config()\n"
    "arguments = training_arguments_kwargs(TrialConfig(checkpointing=True), 'cpu')\n"  # as the study note asks
    "from autotune.views.export import render\n"
    "flags = render(arguments, 'cli')\n"  # the note's command-line flags: the parser's nargs
    "from autotune.result import TrialResult\n"
    "from autotune.views.export import for_the_trainer\n"
    "clip = for_the_trainer(arguments, TrialResult(status='ok', gradient_scale=2))['max_grad_norm']\n"  # a winner that
    # accumulated: its clipping from TrainingArguments' default
    "from autotune.space import load_space\n"
    "from autotune.spec.devices import cpu_device\n"
    "space = load_space(None, cpu_device(), model=spec)\n"  # the default space's kernels the model builds with
    "assert space.choices['attn_implementation'] == ['sdpa', 'eager'], space.choices\n"
    "print(spec.num_params, config.micro_batch, sorted(k for k in arguments if 'checkpointing' in k)[0], len(flags), clip,"
    " 'transformers.models.bert.modeling_bert' in sys.modules, 'transformers.training_args' in sys.modules,"
    " 'transformers' in sys.modules, 'torch' in sys.modules)\n"
)


@pytest.mark.slow
def test_a_second_search_start_imports_neither_transformers_nor_torch(tmp_path):
    """Its model, defaults, flags and kernels all read back from the derived cache: 2.5 s of CPU at every later
    `autotune search` start on a 2-core machine (docs/benchmarks.md, "The test suite")."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    runs = [
        subprocess.run([sys.executable, "-c", SEARCH_START], capture_output=True, text=True, env=env, timeout=300)
        for _ in range(2)
    ]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    first, second = (run.stdout.split() for run in runs)
    assert first[5:] == ["True"] * 4  # computed: the model was built, the class read
    assert second[:5] == first[:5]  # the same parameter count, defaults, checkpointing field, flags and clipping
    assert float(first[4]) == 2 * _class_default("max_grad_norm")  # the default clipping, doubled
    assert second[5:] == ["False"] * 4
    # the model's description and its counts, the defaults, the checkpointing field's name, the parser's nargs,
    # the TrainingArguments defaults the export reads and one build per kernel
    assert len(list((tmp_path / "autotune" / "derived").glob("*.json"))) == 8


def _class_default(name: str) -> object:
    import dataclasses

    from transformers import TrainingArguments

    return {field.name: field.default for field in dataclasses.fields(TrainingArguments)}[name]
