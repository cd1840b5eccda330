"""bench/parse_speed.py and bench/corpus_pipeline.py end to end on the shared Vox corpus: each reads what it says
it reads, and its record's counts agree with each other."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import corpus_pipeline  # noqa: E402
import parse_speed  # noqa: E402

from mens.lang.vox import parse  # noqa: E402


def _main(script, monkeypatch, *args: str) -> None:
    monkeypatch.setattr(sys, "argv", [script.__file__, *args])
    script.main()


def test_doc_blocks_are_the_vox_fences_only():
    md = "intro\n```vox\nfn a() to int {\n    return 1\n}\n```\n```python\nx = 1\n```\n```vox\nlet b = 2\n```\n"
    assert parse_speed.doc_blocks(md) == ["fn a() to int {\n    return 1\n}\n", "let b = 2\n"]


def test_parse_speed_times_every_file_and_doc_block(shared_vox, tmp_path, monkeypatch):
    _main(parse_speed, monkeypatch, "--corpus", str(shared_vox), "--rounds", "2", "--out", str(tmp_path))
    (path,) = tmp_path.glob("parse_speed-*.json")
    rec = json.loads(path.read_text())
    texts = parse_speed.load_corpus(shared_vox)
    assert rec["inputs"] == len(texts) > len(list(shared_vox.rglob("*.vox")))  # files and doc blocks
    assert rec["parse_ok"] == sum(parse(t).ok for t in texts) and 0 < rec["parse_ok"] <= rec["inputs"]
    assert len(rec["seconds_per_round"]) == 2 and rec["best_seconds"] == min(rec["seconds_per_round"])
    assert abs(rec["lines_per_second"] * rec["best_seconds"] - rec["lines"]) <= 1e-3 * rec["lines"]  # best round
    assert rec["machine"]["cpu"]


def test_corpus_pipeline_runs_every_stage_and_its_counts_agree(shared_vox, tmp_path, monkeypatch):
    _main(corpus_pipeline, monkeypatch, "--shared", str(shared_vox), "--out", str(tmp_path))
    (path,) = tmp_path.glob("corpus_pipeline-*.json")
    rec = json.loads(path.read_text())
    stages, counts = rec["stages"], rec["counts"]
    assert list(stages) == ["extract", "validate", "pairs", "eval", "generate", "mix"]
    assert all(s["records"] > 0 and s["seconds"] >= 0 for s in stages.values())
    assert counts["kept"] + sum(counts["rejected"].values()) == counts["units"] == stages["extract"]["records"]
    assert stages["validate"]["records"] == counts["units"] and stages["pairs"]["records"] == counts["kept"]
    assert counts["pairs"] >= counts["kept"] and 0 < counts["parse_rate"] <= 1 and counts["mixed_rows"] > 0
    assert rec["seconds_total"] >= rec["seconds_extract_to_eval"] and rec["goal_met"] == (rec["seconds_total"] < 10)
