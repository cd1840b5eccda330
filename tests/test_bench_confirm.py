"""The splits outside the shipped bench: the confirmation split (bench/confirm/: 60 tasks written by a writer who had
seen no model answer, for judging a finished recipe once) and the documented-features split (bench/features/: a task
or two for each keyword and decorator the docs use). Both are kept out of the shipped bench and out of every training
file. Each reference answer passes its own task, and none of them comes near the shipped bench (which dogfood trains
on, dev split, or reports on)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mens.dogfood.heldout import decontaminate, dev_pairs
from mens.evaluate.bench import load_bench, load_references
from mens.lang import get_language
from mens.lang.checks import check_output

BENCH = Path(__file__).parents[1] / "bench"
SPLITS = {"confirm": BENCH / "confirm" / "vox_confirm.jsonl", "features": BENCH / "features" / "vox_features.jsonl"}


@pytest.mark.parametrize("name", sorted(SPLITS))
def test_references_pass_and_stay_apart_from_the_bench(name):
    tasks, refs = load_bench(SPLITS[name]), load_references(SPLITS[name])
    assert len(tasks) == 60 and set(refs) == {t.id for t in tasks}
    vox = get_language("vox")
    failed = [t.id for t in tasks if not check_output(refs[t.id], t.expect, vox).passed]
    assert not failed
    if name == "features":  # each task asks for its feature, and together they use 50 of them
        assert all(t.expect.contains and t.expect.contains[0] in vox.features(refs[t.id]) for t in tasks)
        assert len(set().union(*(vox.features(refs[t.id]) for t in tasks))) >= 50
    assert not {t.id for t in tasks} & {t.id for t in load_bench()}
    bench_refs = load_references()
    bench_rows = dev_pairs(None, "vox") + [{"prompt": t.prompt, "response": bench_refs[t.id]}
                                           for t in load_bench() if t.split == "heldout"]
    kept, report = decontaminate(bench_rows, tasks, refs)
    assert report.dropped == [] and report.max_prompt_similarity < 0.3
