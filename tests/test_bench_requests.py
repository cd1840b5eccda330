"""Request sets kept beside the shipped one for recipe arms (bench/requests/*.jsonl): each stays loadable (every answer
parses and meets its own expectations), adds rows the shipped file lacks, and stays as far from the bench splits
as the shipped file must (no reference answer's code, no near-copy of a task's prompt), so that an arm that appends
it judges the recipe and not a leak."""

from __future__ import annotations

from pathlib import Path

import pytest

from mens.corpus.requests import load_requests
from mens.dogfood.heldout import decontaminate, heldout_tasks

BENCH = Path(__file__).parents[1] / "bench"
SETS = sorted((BENCH / "requests").glob("*.jsonl"))
SPLITS = ((str(BENCH / "confirm" / "vox_confirm.jsonl"), "all"),  # (bench file, split); None: the shipped bench
          (str(BENCH / "features" / "vox_features.jsonl"), "all"), (None, "heldout"))


@pytest.mark.parametrize("path", SETS, ids=[p.name for p in SETS])
def test_request_set_loads_is_new_and_stays_apart_from_every_split(path):
    reqs, shipped = load_requests("vox", path), load_requests("vox")
    assert reqs
    for field in ("id", "prompt", "answer"):
        assert not {getattr(r, field) for r in reqs} & {getattr(r, field) for r in shipped}, field
    rows = [{"prompt": r.prompt, "response": r.answer} for r in reqs]
    for split in SPLITS:
        _, report = decontaminate(rows, *heldout_tasks(*split))
        assert report.dropped == [], (split, report.dropped[:3])


def test_the_sets_do_not_repeat_each_other():
    seen: dict[str, Path] = {}
    for path in SETS:
        for r in load_requests("vox", path):
            assert r.prompt not in seen, (r.id, path, seen[r.prompt])
            seen[r.prompt] = path
