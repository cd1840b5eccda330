"""Task-shaped synthetic pairs: checked against their own expect, varied, decontaminated, focusable."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from mens.corpus import taskgen
from mens.corpus.taskgen import focus_from_results, generate_task_pairs, load_task_templates
from mens.dogfood.heldout import decontaminate, heldout_tasks
from mens.evaluate.bench import heldout_names
from mens.lang import get_language
from mens.lang.checks import Expect, check_output

AVOID = heldout_names()

ALIAS_WORDS = ["action", "loader", "handler", "RPC", "page", "view", "screen", "model", "schema", "DB table", "enum",
               "helper", "utility", "spec", "test case", "route table", "job", "cron", "tool"]


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    n = 2 * len(load_task_templates("vox")["templates"])
    return generate_task_pairs(n, seed=7, avoid_names=AVOID)[0]


def _kind(row: dict) -> str:
    return row["source"].rsplit(":", 1)[1]


def test_deterministic_for_a_seed(rows):
    assert generate_task_pairs(len(rows), seed=7, avoid_names=AVOID)[0] == rows
    assert (generate_task_pairs(40, seed=8, avoid_names=AVOID)[0]
            != generate_task_pairs(40, seed=7, avoid_names=AVOID)[0])


def test_every_row_parses_and_passes_its_own_expect(rows):
    lang = get_language("vox")
    fields = {"prompt", "response", "category", "rating", "schema_version", "source", "constructs", "lane",
              "response_mode", "task_family", "origin", "expect"}
    for row in rows:
        assert set(row) == fields and row["origin"] == "synthetic"
        assert lang.parse(row["response"]).has_code
        check = check_output(row["response"], Expect(**row["expect"]), lang)
        assert check.passed, (row["source"], check.failures)


def test_covers_every_template_and_many_categories(rows):
    templates = load_task_templates("vox")["templates"]
    assert len(templates) >= 50
    assert {_kind(r) for r in rows} == {t["kind"] for t in templates}
    assert len({r["category"] for r in rows}) >= 18
    kinds = Counter(k for r in rows for k in r["constructs"])
    for k in ["fn", "type_struct", "type_adt", "table", "index", "endpoint", "test", "forall", "component",
              "fragment", "routes", "mcp_tool", "mcp_resource", "actor",
              "state_machine", "scheduled", "form", "import", "let_const"]:
        assert kinds[k], k


def test_names_are_varied(rows):
    fn_names = [n for r in rows for k, n in r["expect"].get("decls", []) if k == "fn"]
    assert len(set(fn_names)) >= 0.8 * len(fn_names)
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", n) for n in fn_names)
    comps = [n for r in rows for k, n in r["expect"].get("decls", []) if k == "component"]
    assert all(re.fullmatch(r"[A-Z][A-Za-z0-9]*", n) for n in comps)


def test_prompts_use_the_request_words_vox_does_not_have(rows):
    text = "\n".join(r["prompt"] for r in generate_task_pairs(600, seed=1, avoid_names=AVOID)[0])
    missing = [w for w in ALIAS_WORDS if not re.search(rf"\b{re.escape(w)}\b", text, re.I)]
    assert not missing
    # Some prompts give a full signature, others only a name and a description.
    prompts = [r["prompt"] for r in rows]
    assert sum(bool(re.search(r"\w+\([^)]*\) to \S+", p)) for p in prompts) > len(prompts) / 2
    assert any(not re.search(r"\) to ", p) for p in prompts)


def test_no_heldout_names_and_survives_decontamination(rows):
    tasks, refs = heldout_tasks(None, "heldout")
    heldout = set()
    for t in tasks:
        heldout |= {n for _, n in t.expect.decls} | set(t.expect.names) | set(t.expect.params)
    used = {n for r in rows for _, n in r["expect"].get("decls", [])} | {
        n for r in rows for n in r["expect"].get("names", [])}
    assert not used & heldout
    # No template declares a fixed name: every expected name is built from random values.
    for tpl in load_task_templates("vox")["templates"]:
        ex = tpl["expect"]
        for name in [n for _, n in ex.get("decls", [])] + ex.get("names", []) + list(ex.get("params", {})):
            assert "$" in name, (tpl["kind"], name)
    kept, rep = decontaminate(rows, tasks, refs)
    assert rep.kept >= 0.95 * len(rows), rep.dropped[:3]


def test_focus_shifts_the_category_distribution():
    base = Counter(r["category"] for r in generate_task_pairs(300, seed=2, avoid_names=AVOID)[0])
    focused = Counter(r["category"] for r in generate_task_pairs(300, seed=2, focus={"routes": 5, "actor": 5},
                                                                 avoid_names=AVOID)[0])
    for cat in ("vox_task_routes", "vox_task_actor"):
        assert focused[cat] >= 3 * base[cat]
    assert focused["vox_task_fn"] < base["vox_task_fn"]
    only = generate_task_pairs(30, seed=2, focus={**{c: 0 for c in taskgen.BENCH_TO_TEMPLATE}, "form": 1},
                               avoid_names=AVOID)[0]
    assert {r["category"] for r in only} == {"vox_task_form"}


def _result(tid: str, cat: str, passed: bool, failure: str = "kind") -> dict:
    fails = [] if passed else [{"category": failure, "reason": "expected something else"}]
    return {"id": tid, "category": cat, "samples": [{"pass": passed, "failures": fails}]}


def test_focus_from_results_weights_failed_categories():
    results = {"results": [_result("a", "fn", True), _result("b", "fn", False, "params"),
                           _result("c", "routes", False), _result("d", "routes", False),
                           _result("e", "component", True), _result("f", "test", False, "parse")]}
    w = focus_from_results(results)
    assert w["routes"] == 5.0 and w["fn"] == 3.0 and w["component"] == 1.0
    assert w["test"] == 5.0 and w["forall"] == 5.0  # a failing bench `test` lifts both test templates
    assert w["program"] == pytest.approx(1.5)  # 3 of 6 tasks failed on kind/name/params
    with pytest.raises(ValueError, match="results"):
        focus_from_results({"metrics": {}})


def test_a_pair_failing_its_expect_is_never_written(monkeypatch):
    data = dict(load_task_templates("vox"))
    data["templates"] = [{"kind": "bad", "category": "fn", "prompts": ["Write ${e}_x."],
                          "code": "fn ${e}_x() to int {\n    return 1\n}\n",
                          "expect": {"decls": [["fn", "${e}_y"]]}}]
    monkeypatch.setattr(taskgen, "load_task_templates", lambda lang: data)
    rows, rep = generate_task_pairs(2, seed=0, avoid_names=AVOID)
    assert rows == [] and rep.rejected_expect == 2 * taskgen.MAX_TRIES and "bad:" in rep.failures[0]


def test_cli_generate_tasks_and_focus(tmp_path):
    from typer.testing import CliRunner

    from mens.cli.main import app

    results = tmp_path / "benchmark_results.json"
    results.write_text(json.dumps({"results": [_result("a", "mcp", False)]}), encoding="utf-8")
    out = tmp_path / "tasks.jsonl"
    res = CliRunner().invoke(app, ["corpus", "generate", "-o", str(out), "-n", "40", "--focus", str(results)])
    assert res.exit_code == 0, res.output
    assert "focus: mcp 5" in res.output and "task pairs" in res.output
    got = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(got) == 40 and all("expect" in r for r in got)
    res = CliRunner().invoke(app, ["corpus", "generate", "-o", str(out), "-n", "5"])
    assert res.exit_code == 0 and "programs" in res.output
    assert all("expect" not in json.loads(line) for line in out.read_text(encoding="utf-8").splitlines())
