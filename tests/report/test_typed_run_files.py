"""The report, card and publish read a run's files through mens.run_records: files an older mens wrote still show,
absent files read as empty records, a corrupt one is a one-line DataError, and what publish writes reads back as
the typed records."""

from __future__ import annotations

import json

import pytest
from tests.report.conftest import bench_results

from mens import run_records as rr
from mens.errors import DataError
from mens.report.card import build_card
from mens.report.facts import hyperparameters
from mens.report.html import write_report
from mens.report.runfiles import read_run


@pytest.fixture
def dogfood_run(tmp_path):
    """A run inside a dogfood directory, its files as an older mens wrote them (old schema ids), plus the held-out
    split and the merge parity `mens dogfood` writes."""
    root = tmp_path / "dogfood"
    run = root / "run"
    (root / "data").mkdir(parents=True)
    run.mkdir()
    (run / rr.MANIFEST).write_text(json.dumps({
        "schema_version": "mens.training_manifest.v1", "backend": "lora", "base_model": "smollm2-135m",
        "system_prompt": "You write Vox.", "examples": {"train": 96, "val": 4}, "data_sha256": "cd" * 32,
        "config": {"model": "smollm2-135m", "r": 8, "learning_rate": 0.0005, "extra": {"dogfood": str(root)}},
        "steps": {"planned": 12, "completed": 12, "global_batch": 4, "warmup": 1},
        "parallelism": "fsdp", "world_size": 2}))
    (run / rr.SUMMARY).write_text(json.dumps({"schema_version": "mens.run_summary.v1", "steps": 12,
                                              "first_loss": 3.5, "final_loss": 0.75, "tokens_per_s": 99.0}))
    (run / rr.BENCHMARK).write_text(json.dumps(bench_results(str(run), str(root / "bench" / "heldout.jsonl"))))
    (run / rr.GATE_RECEIPT).write_text(json.dumps({
        "schema": "vox_mens_gate_receipt_v1", "overall_passed": True,
        "gates": [{"name": "min_gain_over_base", "gate": "min_gain_over_base", "threshold": 0.3, "value": 0.75,
                   "passed": True}]}))
    (run / rr.MERGE_PARITY).write_text(json.dumps({
        "schema": "mens_merge_parity_v1", "decoding": "greedy",
        "merged_vs_adapter": {"tasks": 4, "same_result": 3, "same_text": 2, "different_result": ["fn-gcd"]},
        "served_vs_merged": {"tasks": 2, "same_result": 2, "same_text": 1}}))
    (root / "data" / rr.HELDOUT_SPLIT).write_text(json.dumps({
        "schema": "mens_heldout_split_v1", "rows_in": 100, "kept": 93, "dropped": 7, "heldout_tasks": 4,
        "prompt_near_dup_threshold": 0.5}))
    return run


def test_card_and_report_show_gates_parity_and_split_from_files_an_older_mens_wrote(dogfood_run):
    card = build_card(dogfood_run)
    assert "| min_gain_over_base | 0.3 | 0.75 | yes |" in card and "Overall: passed." in card
    assert "same task result as the trained weights on 3 of 4 held-out tasks (2 answers identical" in card
    assert "gives the same result on 2 of 2 (1 identical)" in card
    assert "Tasks whose result changed in the merge: fn-gcd." in card
    assert "held out: 4 bench tasks no training row overlaps; 7 rows were dropped" in card
    assert "Jaccard >= 0.5" in card and "(lora training)" in card and "`" + "cd" * 32 + "`" in card
    assert "| parallelism | fsdp (2 processes) |" in card and "| optimizer steps | 12 of 12 planned |" in card
    page = write_report(dogfood_run).read_text()
    assert "<td>min_gain_over_base</td><td class=num>0.3</td>" in page
    assert "same task result on 3 of 4 held-out tasks" in page and "same result on 2 of 2 (1 identical)" in page
    assert "<td>first / final train loss</td><td class=num>3.5 / 0.75</td>" in page


def test_absent_files_read_as_empty_records_and_a_corrupt_one_is_a_one_line_error(tmp_path):
    files = read_run(tmp_path)
    assert files.present == set() and files.manifest == rr.TrainingManifest() and files.bench.metrics == {}
    assert "No gate was run" in build_card(tmp_path)
    (tmp_path / rr.SUMMARY).write_text('{"steps": 3,')
    with pytest.raises(DataError, match=r"run_summary.json:1: malformed JSON") as e:
        read_run(tmp_path)
    assert "\n" not in str(e.value)
    (tmp_path / rr.SUMMARY).write_text(json.dumps({"steps": 3}))
    (tmp_path / rr.GATE_RECEIPT).write_text(json.dumps({"schema": "vox_mens_gate_receipt_v1", "gates": "all"}))
    with pytest.raises(DataError, match="gate_receipt.json: not a vox_mens_gate_receipt_v1 record: field gates"):
        build_card(tmp_path)


def test_hyperparameters_take_the_typed_manifest_or_a_plain_dict():
    doc = {"backend": "lora", "config": {"r": 4, "learning_rate": 0.001}, "steps": {"warmup": 2}}
    assert hyperparameters(doc) == hyperparameters(rr.TrainingManifest(**doc))
    assert ("LoRA rank r", "4") in hyperparameters(doc)
    with pytest.raises(DataError, match="field steps"):
        hyperparameters({"steps": "many"})


def test_published_results_and_training_config_read_back_as_records(tmp_path, finished_run):
    from mens.report.publish import TRAINING_CONFIG, stage_folder

    run, base_dir = finished_run
    out = tmp_path / "upload"
    stage_folder(run, out, repo_id="someone/vox-tiny")
    cfg = rr.TrainingConfigRecord.read(out / TRAINING_CONFIG)
    assert cfg.schema_id == "vox_mens_training_config_v1" and cfg.config["r"] == 4
    assert "data" not in cfg.config and "output_dir" not in cfg.config  # local paths stay home
    assert cfg.model_extra["steps"]["completed"] == 10 and cfg.model_extra["backend"] == "lora"
    bench = rr.BenchmarkResults.read(out / rr.BENCHMARK)
    assert bench.schema_id == rr.BenchmarkResults.SCHEMA and bench.bench == "heldout.jsonl"
    assert bench.metrics["pass_at_1"] == 0.5 and bench.base["model"] == "base"
    assert str(tmp_path) not in (out / rr.BENCHMARK).read_text() + (out / TRAINING_CONFIG).read_text()
