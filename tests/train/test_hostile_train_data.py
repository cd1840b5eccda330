"""`mens train` end to end on a hostile train.jsonl: one line naming every bad row, exit 2, no traceback, fast."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "corpus"))  # the corpus tests' hostile inputs

from hostile_inputs import JSONL_FAULTS, run_cli, write_jsonl_faults  # noqa: E402


# fence_bomb is a well-formed pair (a silly answer): the trainer may keep it; every other fault is a bad row
@pytest.mark.parametrize("faults", [["nested_array", "lone_surrogate", "nul_raw"],
                                    sorted(set(JSONL_FAULTS) - {"fence_bomb"})])
def test_mens_train_names_each_bad_row_in_one_line(tmp_path, tiny_model_dir, capsys, faults):
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl_faults(data / "train.jsonl", faults, good=30)
    code, out, took = run_cli(capsys, "train", "--data-dir", data, "--output-dir", tmp_path / "run",
                              "--model", tiny_model_dir, "--backend", "lora", "--device", "cpu", "--max-steps", "1")
    assert code == 2 and "Traceback" not in out, out
    errors = [line for line in out.splitlines() if "not valid train.jsonl records" in line]
    assert len(errors) == 1, out
    shown = min(len(faults), 10)  # the message lists the first 10 and counts the rest
    assert errors[0].count("train.jsonl:") >= shown
    assert f"{len(faults)} of {30 + len(faults)} lines" in errors[0]
    assert took < 20
    assert not (tmp_path / "run" / "adapter_model.safetensors").exists()
