"""benchmarks/bench_speed_prior.py's check of a grid measured several times on a calibrated CPU."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from autotune.spec.measured_peaks import PEAKS_FILE_ENV
from benchmarks.bench_speed_prior import DATA, REPEATED_GRIDS, repeated_grid_check

GRID = "bench_grid_llama_xeon_amx"
CEILING = REPEATED_GRIDS[GRID]


def test_passes_that_agree_rank_alike_and_the_prior_reads_the_grids_own_calibration(tmp_path, monkeypatch):
    for name in ("pass1.json", "calibration.json"):
        shutil.copy(DATA / GRID / name, tmp_path / name)
    shutil.copy(DATA / GRID / "pass1.json", tmp_path / "pass2.json")
    monkeypatch.setenv(PEAKS_FILE_ENV, str(tmp_path / "elsewhere.json"))  # the user's own: left as it was
    result = repeated_grid_check(tmp_path, CEILING)
    assert result["passes"] == 2 and result["configs"] > 3
    assert result["pass_vs_pass_spearman"]["median"] == pytest.approx(1.0)
    assert result["pass_vs_median_of_others"] == [pytest.approx(1.0)] * 2
    calibrated, nominal = result["calibrated"], result["nominal"]
    assert calibrated["spearman_zero_each_pass"] == [calibrated["spearman_zero"]] * 2
    assert "(measured" in calibrated["fit"] and "nominal" in nominal["fit"]
    assert os.environ[PEAKS_FILE_ENV] == str(tmp_path / "elsewhere.json")


def test_a_pass_that_reverses_another_is_said(tmp_path):
    for name in ("pass1.json", "calibration.json"):
        shutil.copy(DATA / GRID / name, tmp_path / name)
    grid = json.loads((tmp_path / "pass1.json").read_text())
    figures = sorted(row["result"]["model_tflops"] for row in grid["results"] if row["result"]["model_tflops"])
    for row in grid["results"]:  # each config's figure swapped for its mirror in the order: ranks reversed
        figure = row["result"]["model_tflops"]
        if figure:
            row["result"]["model_tflops"] = figures[len(figures) - 1 - figures.index(figure)]
    (tmp_path / "pass2.json").write_text(json.dumps(grid))
    result = repeated_grid_check(tmp_path, CEILING)
    assert result["pass_vs_pass_spearman"]["median"] < -0.5


def test_llm_foundrys_rows_are_read_whole_and_each_mpt_is_the_size_the_tables_print(tmp_path):
    """The wider published check (docs/benchmarks.md, "Every one-node row of llm-foundry's H100 and A100 tables"):
    every row predicted, and the MPT shapes the bench builds from llm-foundry's yamls have the parameter count the
    tables print (a wrong width or depth would be off by far more than the 1.5 % their count of the embeddings
    and norms leaves)."""
    from benchmarks.bench_speed_prior import FOUNDRY_FILE, foundry_summary, foundry_sweep, published_model

    published = json.loads(FOUNDRY_FILE.read_text())
    rows = foundry_sweep(tmp_path)
    assert len(rows) == sum(len(figures) for figures in published["rows"].values()) > 70
    assert all(row["predicted_tokens_per_s"] > 0 and 0 < row["predicted_mfu"] < 1 for row in rows)
    for name, count in published["num_params"].items():
        assert published_model(name, tmp_path).num_params == pytest.approx(count, rel=0.015)
    summary = foundry_summary(rows)
    assert sum(band["rows"] for band in summary.values()) == len(rows)


def test_the_median_of_passes_is_each_configs_middle_measured_row_and_drops_what_a_pass_lacks(tmp_path):
    from benchmarks.bench_speed_prior import median_pass_grid

    grid = json.loads((DATA / GRID / "pass1.json").read_text())
    measured = [row for row in grid["results"] if row["result"]["model_tflops"]]
    for name, scale in (("pass1.json", 0.9), ("pass2.json", 1.1), ("pass3.json", 1.0)):
        rows = [
            {**row, "result": {**row["result"], "model_tflops": row["result"]["model_tflops"] * scale}}
            for row in measured
        ]
        if name == "pass2.json":
            rows = rows[1:]  # a config this pass did not measure
        (tmp_path / name).write_text(json.dumps({**grid, "results": rows}))
    median = median_pass_grid(tmp_path)
    assert len(median.results) == len(measured) - 1
    originals = {tuple(sorted(row["params"].items())): row["result"]["model_tflops"] for row in measured}
    for config, result in median.results.items():
        assert result.model_tflops == pytest.approx(originals[tuple(sorted(config.to_params().items()))])


def test_the_search_replayed_on_the_median_proposes_only_what_every_pass_measured(tmp_path):
    """A first pass that measured more than the others (gpt2-tiny's: micro-batch 32 too) records the wider space;
    the replayed search's space is narrowed to what the median grid has, so it never asks for a config no pass
    but one measured (the grid runner has no row for it)."""
    from benchmarks.bench_speed_prior import repeated_search_model_check

    shutil.copy(DATA / GRID / "calibration.json", tmp_path / "calibration.json")
    grid = json.loads((DATA / GRID / "pass1.json").read_text())
    assert 4 in grid["meta"]["space"]["micro_batch"]
    (tmp_path / "pass1.json").write_text(json.dumps(grid))
    narrower = [row for row in grid["results"] if row["params"]["micro_batch"] != 4]
    (tmp_path / "pass2.json").write_text(json.dumps({**grid, "results": narrower}))
    workdir = tmp_path / "work"
    workdir.mkdir()
    check = repeated_search_model_check(tmp_path, CEILING, workdir)
    assert check["picks"] and not any(pick.startswith("mb=4 ") for pick in check["picks"])
    replayed = json.loads((workdir / f"{tmp_path.name}-space.yaml").read_text())
    assert replayed["micro_batch"] == [1, 2]


def test_torchtitans_rows_are_each_predicted_on_the_llama_the_page_names(tmp_path):
    """torchtitan's published rows (docs/benchmarks.md, "torchtitan's Llama 2 and Llama 3 rows"): each predicted,
    the shapes the bench writes have the parameter count of the published checkpoints (a wrong width, depth or
    key/value head count would be off by far more than 0.5 %), and a selectively checkpointed row lies between the
    prior's step without checkpointing and with every layer checkpointed."""
    from benchmarks.bench_speed_prior import TORCHTITAN_FILE, torchtitan_sweep

    published = json.loads(TORCHTITAN_FILE.read_text())
    rows = torchtitan_sweep(tmp_path)
    assert len(rows) == len(published["rows"])
    for name, shape in published["models"].items():
        if isinstance(shape, dict):
            from autotune.spec.models import resolve_model

            assert resolve_model(str(tmp_path / name)).num_params == pytest.approx(shape["num_params"], rel=0.005)
    for row in rows:
        low, high = row["every_layer_checkpointed"], row["without_checkpointing"]
        assert 0 < low < high
        assert low <= row["predicted_tokens_per_s"] <= high
        if row["checkpointing"] == "selective":
            assert low < row["predicted_tokens_per_s"] < high
