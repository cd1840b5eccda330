"""mens.run_records: one module names every run file and types its records; readers validate, writers are atomic."""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path

import pytest

from mens import run_records as rr
from mens.errors import DataError

SRC = Path(__file__).resolve().parents[1] / "src" / "mens"
RUN_FILES = {rr.MANIFEST, rr.SUMMARY, rr.PREFLIGHT, rr.TELEMETRY, rr.BENCHMARK, rr.GATE_RECEIPT, rr.MERGE_PARITY,
             rr.DOGFOOD_STATE, rr.DOGFOOD_SUMMARY, rr.HELDOUT_SPLIT, rr.BUDGET, rr.SERVING, rr.SYSTEM_PROMPT}


def _string_constants(path: Path) -> list[tuple[int, str]]:
    """String literals of a module that are not docstrings (f-string parts included)."""
    tree = ast.parse(path.read_text("utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


def test_no_module_but_run_records_spells_a_run_file_name():
    """A writer and its readers share the constant, so a rename cannot leave a reader behind."""
    found = [f"{path.relative_to(SRC)}:{line}: {value!r}" for path in SRC.rglob("*.py")
             if path.name != "run_records.py" for line, value in _string_constants(path) if value in RUN_FILES]
    assert not found, "use the mens.run_records constant instead:\n" + "\n".join(found)


def test_every_schema_id_has_one_spelling_and_no_old_spelling_is_written():
    ids = [*rr.RECORDS, rr.CHECKPOINT_FORMAT, rr.OPTIMIZER_FORMAT, rr.SCHEDULER_FORMAT, rr.RNG_FORMAT]
    assert all(re.fullmatch(r"vox_mens_[a-z_]+_v\d+", i) for i in ids), ids
    old = re.compile(r"mens[._][a-z_]+[._]v\d+")
    legacy = {i for cls in rr.RECORDS.values() for i in cls.LEGACY} | set(rr.LEGACY_FORMATS)
    found = [f"{path.relative_to(SRC)}:{line}: {value!r}" for path in SRC.rglob("*.py")
             if path.name != "run_records.py" for line, value in _string_constants(path)
             if old.fullmatch(value) and not value.startswith("vox_mens_") and value != "vox.mens.preflight.v0"]
    assert not found, "schema ids are spelled vox_mens_<name>_v<N> (mens.run_records):\n" + "\n".join(found)
    assert legacy.isdisjoint(ids)


def test_a_record_round_trips_and_keeps_keys_it_does_not_declare(tmp_path):
    m = rr.TrainingManifest(run_id="r1", backend="lora", config={"r": 16}, steps={"completed": 3}, future_key=[1, 2])
    m.write(tmp_path / rr.MANIFEST)
    data = json.loads((tmp_path / rr.MANIFEST).read_text())
    assert next(iter(data)) == "schema" and data["schema"] == "vox_mens_training_manifest_v1"
    back = rr.TrainingManifest.read(tmp_path / rr.MANIFEST)
    assert back.run_id == "r1" and back.steps == {"completed": 3} and back.to_json() == data
    assert data["future_key"] == [1, 2]


@pytest.mark.parametrize(("cls", "old"), [(rr.TrainingManifest, {"schema_version": "mens.training_manifest.v1"}),
                                          (rr.RunSummary, {"schema_version": "mens.run_summary.v1"}),
                                          (rr.BenchmarkResults, {"schema": "mens_benchmark_results_v1"}),
                                          (rr.MergeParity, {"schema": "mens_merge_parity_v1"})])
def test_files_an_older_mens_wrote_read_as_the_current_record(tmp_path, cls, old):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({**old, "run_id": "x"}))
    assert cls.read(path).to_json()["schema"] == cls.SCHEMA


def test_a_file_that_is_not_the_record_is_a_one_line_error_naming_file_and_field(tmp_path):
    path = tmp_path / rr.SUMMARY
    path.write_text(json.dumps({"schema": "vox_mens_run_summary_v1", "steps": "many"}))
    with pytest.raises(DataError, match=r"run_summary.json: not a vox_mens_run_summary_v1 record: field steps"):
        rr.RunSummary.read(path)
    path.write_text(json.dumps({"schema": "vox_mens_gate_receipt_v1"}))
    with pytest.raises(DataError, match="schema is 'vox_mens_gate_receipt_v1', expected 'vox_mens_run_summary_v1'"):
        rr.RunSummary.read(path)
    path.write_text('{"schema": ')
    with pytest.raises(DataError, match=r"run_summary.json:1: malformed JSON"):
        rr.RunSummary.read(path)
    path.write_text("[1, 2]")
    with pytest.raises(DataError, match="expected a JSON object"):
        rr.RunSummary.read(path)
    assert rr.RunSummary.read_optional(tmp_path / "missing.json") is None
    with pytest.raises(DataError, match="missing.json not found"):
        rr.RunSummary.read(tmp_path / "missing.json")


def test_a_failed_write_leaves_the_previous_file_and_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / rr.GATE_RECEIPT
    rr.GateReceipt(policy="first").write(path)
    before = path.read_bytes()

    def refuse(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError):
        rr.GateReceipt(policy="second").write(path)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [rr.GATE_RECEIPT]


def test_checkpoint_parts_an_older_mens_wrote_read_as_the_current_format():
    assert rr.current_format("mens.checkpoint.v2") == rr.CHECKPOINT_FORMAT
    assert rr.current_format(rr.RNG_FORMAT) == rr.RNG_FORMAT and rr.current_format(None) is None


def test_a_field_left_at_its_default_is_not_written():
    """Readers of the files mens wrote before these records test for a key's presence (no `base` without a base)."""
    data = rr.BenchmarkResults.parse({"schema": "vox_mens_benchmark_results_v1", "metrics": {"pass_at_1": 0.5}},
                                     "x").to_json()
    assert data == {"schema": "vox_mens_benchmark_results_v1", "metrics": {"pass_at_1": 0.5}}
    assert rr.GateReceipt(policy="p", report=None).to_json() == {"schema": "vox_mens_gate_receipt_v1", "policy": "p",
                                                                 "report": None}
