"""Request sets kept beside the shipped one for recipe arms (bench/requests/*.jsonl): each stays loadable (every answer
parses and meets its own expectations), adds rows the shipped file lacks, and stays as far from the bench splits
as the shipped file must (no reference answer's code, no near-copy of a task's prompt), so that an arm that appends
it judges the recipe and not a leak."""

from __future__ import annotations

from pathlib import Path

import pytest

from mens.corpus.requests import load_requests
from mens.dogfood.heldout import decontaminate
from mens.evaluate.bench import load_bench, load_references

BENCH = Path(__file__).parents[1] / "bench"
SETS = sorted((BENCH / "requests").glob("*.jsonl"))
SPLITS = (BENCH / "confirm" / "vox_confirm.jsonl", BENCH / "features" / "vox_features.jsonl", None)


def _split(path: Path | None):
    if path is not None:
        return load_bench(path), load_references(path)
    tasks = [t for t in load_bench() if t.split == "heldout"]
    refs = load_references()
    return tasks, {t.id: refs[t.id] for t in tasks}


@pytest.mark.parametrize("path", SETS, ids=[p.name for p in SETS])
def test_request_set_loads_is_new_and_stays_apart_from_every_split(path):
    reqs, shipped = load_requests("vox", path), load_requests("vox")
    assert reqs
    for field in ("id", "prompt", "answer"):
        assert not {getattr(r, field) for r in reqs} & {getattr(r, field) for r in shipped}, field
    rows = [{"prompt": r.prompt, "response": r.answer} for r in reqs]
    for split in SPLITS:
        _, report = decontaminate(rows, *_split(split))
        assert report.dropped == [], (split, report.dropped[:3])


def test_the_sets_do_not_repeat_each_other():
    seen: dict[str, Path] = {}
    for path in SETS:
        for r in load_requests("vox", path):
            assert r.prompt not in seen, (r.id, path, seen[r.prompt])
            seen[r.prompt] = path
