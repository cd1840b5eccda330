"""bench/feature_coverage.py: documented features come from corpus code that parses, and the record names those a
training file uses in fewer than --floor samples (never-used ones first)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

fc = pytest.importorskip("feature_coverage")


def test_documented_features_against_training_samples(tmp_path: Path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "guide.md").write_text(
        "# Guide\n\n```vox\n@test\nfn t() to Unit {\n    while true {\n        break\n    }\n}\n```\n\n"
        "```vox\n@forall fn broken( {\n```\n\n"  # does not parse
        "```vox\n// vox:skip\n@deprecated\nfn planned() to int {\n    return 1\n}\n```\n",  # planned syntax
        encoding="utf-8")
    train = tmp_path / "train.jsonl"
    rows = [{"prompt": "p", "response": "@test\nfn t() to Unit {\n    return\n}\n"},
            {"prompt": "q", "response": "fn u() to int {\n    while true {\n        break\n    }\n    return 1\n}\n"}]
    train.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    got = fc.coverage(train, [docs], floor=2)
    assert got["features"]["while"] == {"documented_units": 1, "train_samples": 1}
    assert got["features"]["fn"] == {"documented_units": 1, "train_samples": 2}
    assert "@forall" not in got["features"]  # only in a block that does not parse: not documented
    assert "@deprecated" not in got["features"]  # only in a block marked vox:skip
    assert got["trained_not_documented"] == ["return"]
    assert set(got["under_floor"]) == {"@test", "while", "break", "true"}  # one sample each; fn and to have two
