"""The helpers that read a finished dogfood run back (the parity stage and the bench scripts use them)."""

from __future__ import annotations

from pathlib import Path

from mens.dogfood.parity import finished_tasks
from mens.evaluate.bench import load_bench

BENCH = Path(__file__).resolve().parents[2] / "src" / "mens" / "evaluate" / "data" / "vox_default.jsonl"


def test_finished_tasks_are_the_held_out_file_cut_to_the_runs_limit(tmp_path):
    (tmp_path / "bench").mkdir()
    lines = BENCH.read_text(encoding="utf-8").splitlines()[:7]
    (tmp_path / "bench" / "heldout.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    every = load_bench(tmp_path / "bench" / "heldout.jsonl")
    assert len(every) == 7
    assert [t.id for t in finished_tasks(tmp_path, {"limit": 3})] == [t.id for t in every[:3]]
    assert [t.id for t in finished_tasks(tmp_path, {"limit": None})] == [t.id for t in every]
    assert [t.id for t in finished_tasks(tmp_path, {})] == [t.id for t in every]
