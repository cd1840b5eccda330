"""The shipped Vox bench is achievable: a hand-written reference answer passes every task.

`vox_default_reference.jsonl` (shipped beside the bench) holds one idiomatic answer per task of the default
bench, written in current Vox (0.5.x syntax) and checked by the real Vox parser. If a task's expectation
drifts out of reach (a kind the parser never reports, a name it cannot declare), its reference fails here. The
negative cases show the checks bite: near-miss answers to representative tasks must fail, for the
reason we expect. Needs only the package (no shared corpus, no model).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from mens.dogfood.heldout import decontaminate, dev_pairs, heldout_tasks
from mens.evaluate.bench import load_bench
from mens.lang import get_language
from mens.lang.checks import check_output

VOX = get_language("vox")
TASKS = {t.id: t for t in load_bench()}
REFERENCE_FILE = Path(__file__).parents[2] / "src/mens/evaluate/data/vox_default_reference.jsonl"
REFERENCES = {
    row["id"]: row["answer"]
    for row in map(json.loads, REFERENCE_FILE.read_text(encoding="utf-8").splitlines())
}


def test_every_task_has_exactly_one_reference():
    lines = [ln for ln in REFERENCE_FILE.read_text(encoding="utf-8").splitlines() if ln.strip()]
    assert len(lines) == len(REFERENCES), "duplicate ids in vox_default_reference.jsonl"
    assert sorted(REFERENCES) == sorted(TASKS)


@pytest.mark.parametrize("task_id", sorted(TASKS))
def test_reference_answer_passes(task_id):
    res = check_output(REFERENCES[task_id], TASKS[task_id].expect, VOX)
    assert res.passed, f"{task_id}: {res.failures} (decls {res.decls}, first error {res.first_diagnostic})"


def test_bench_shape():
    tasks = list(TASKS.values())
    assert len(tasks) >= 170
    assert sum(t.split == "heldout" for t in tasks) >= 60
    assert {t.split for t in tasks} <= {"heldout", "dev"}
    assert len({t.category for t in tasks}) >= 12
    # Every task pins at least one declaration kind: "anything that parses" never passes.
    assert all(t.expect.decls or t.expect.kinds for t in tasks)
    # Prompts vary their wording for the same constructs.
    words = Counter(w for t in tasks for w in ("action", "page", "handler", "model", "schema", "route", "loader")
                    if w in t.prompt.lower())
    assert all(words[w] for w in ("action", "page", "handler", "model", "schema", "route", "loader")), words



def test_dev_split_trains_without_touching_the_heldout_split():
    # The dev split is training data in `mens dogfood`: none of its tasks may copy a held-out answer (normalized
    # code hash) or come near a held-out prompt (word 3-gram Jaccard), or the decontamination would silently drop it.
    tasks, refs = heldout_tasks(None, "heldout")
    dev = dev_pairs(None, "vox")
    kept, report = decontaminate(dev, tasks, refs)
    assert len(dev) == sum(t.split == "dev" for t in TASKS.values())
    assert report.dropped == [] and len(kept) == len(dev)
    assert report.max_prompt_similarity < 0.3

# (task id, a plausible but wrong answer, the failure category it must produce)
NEAR_MISSES = [
    # a plain fn where a test was asked for
    ("test-add", "fn add(a: int, b: int) to int {\n    return a + b\n}\n\n"
                 "fn add_works() to Unit {\n    assert(add(2, 3) is 5)\n}\n", "kind"),
    # right shape, wrong name
    ("fn-add", "fn sum(a: int, b: int) to int {\n    return a + b\n}\n", "name"),
    # a parameter missing
    ("fn-clamp", "fn clamp(value: int, high: int) to int {\n    return value\n}\n", "params"),
    # parameter types wrong
    ("fn-add", "fn add(a: float, b: float) to float {\n    return a + b\n}\n", "params"),
    # return type wrong
    ("fn-option", "fn find_user_name(id: int) to str {\n    return \"admin\"\n}\n", "returns"),
    # a query where a mutation was asked for
    ("ep-action-save", "@endpoint(kind: query)\nfn save_note(body: str) to Unit {\n    print(body)\n}\n", "kind"),
    # legacy decorator: the current parser rejects it
    ("ep-loader", "@query\nfn dashboard_stats() to int {\n    return 0\n}\n", "parse"),
    # legacy angle-bracket JSX
    ("comp-page-home", "component HomePage() {\n    view: <h1>Welcome</h1>\n}\n", "parse"),
    # a struct where a table was asked for
    ("table-task", "type Task {\n    title: str\n    done: bool\n}\n", "kind"),
    # a component without the required state
    ("comp-counter", "component Counter() {\n    view: button() { \"+\" }\n}\n", "contents"),
    # a stub
    ("fn-greet", "fn greet(name: str) to str {\n    // TODO\n    return name\n}\n", "placeholder"),
    # comments only
    ("fn-const-2", "// let default_page_size = 20\n", "empty"),
    # routes missing entirely
    ("routes-basic", "component Home() {\n    view: text() { \"h\" }\n}\n\n"
                     "component About() {\n    view: text() { \"a\" }\n}\n", "kind"),
]


@pytest.mark.parametrize(("task_id", "answer", "category"), NEAR_MISSES,
                         ids=[f"{t}-{c}" for t, _, c in NEAR_MISSES])
def test_near_miss_answers_fail(task_id, answer, category):
    res = check_output(answer, TASKS[task_id].expect, VOX)
    assert not res.passed
    assert category in {c for c, _ in res.failures}, res.failures


def test_references_parse_cleanly_in_a_fence():
    # A reference wrapped the way a chat model answers still passes (extraction + parse).
    task = TASKS["fn-factorial"]
    wrapped = f"Here you go:\n\n```vox\n{REFERENCES['fn-factorial']}```\n\nIt recurses until n <= 1."
    assert check_output(wrapped, task.expect, VOX).passed
