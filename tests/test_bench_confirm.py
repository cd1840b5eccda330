"""The confirmation split (bench/confirm/): 60 tasks written by a writer who had seen no model answer, kept out of the
shipped bench and out of every training file, for judging a finished recipe once. Each reference answer passes its
own task, and none of them comes near the shipped bench (which dogfood trains on, dev split, or reports on)."""

from __future__ import annotations

from pathlib import Path

from mens.dogfood.heldout import decontaminate, dev_pairs
from mens.evaluate.bench import load_bench, load_references
from mens.lang import get_language
from mens.lang.checks import check_output

CONFIRM = Path(__file__).parents[1] / "bench" / "confirm" / "vox_confirm.jsonl"


def test_confirm_references_pass_and_stay_apart_from_the_bench():
    tasks, refs = load_bench(CONFIRM), load_references(CONFIRM)
    assert len(tasks) == 60 and set(refs) == {t.id for t in tasks}
    vox = get_language("vox")
    failed = [t.id for t in tasks if not check_output(refs[t.id], t.expect, vox).passed]
    assert not failed
    assert not {t.id for t in tasks} & {t.id for t in load_bench()}
    bench_refs = load_references()
    bench_rows = dev_pairs(None, "vox") + [{"prompt": t.prompt, "response": bench_refs[t.id]}
                                           for t in load_bench() if t.split == "heldout"]
    kept, report = decontaminate(bench_rows, tasks, refs)
    assert report.dropped == [] and report.max_prompt_similarity < 0.3
