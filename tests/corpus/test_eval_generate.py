"""Eval (parse rate vs non-empty parse rate, coverage, gates) and the synthetic generator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mens.corpus.eval import eval_to_file, evaluate_file
from mens.corpus.generate import generate_programs
from mens.errors import GateFailed
from mens.lang import get_language

GOOD = "fn f() to int {\n    return 1\n}\n"


def _train(tmp_path: Path) -> Path:
    p = tmp_path / "t.jsonl"
    rows = [{"prompt": "a", "response": GOOD, "category": "vox_fn"},
            {"prompt": "b", "response": "// only a comment\n", "category": "vox_fn"},
            {"prompt": "c", "response": "fn broken( {", "category": "x"},
            {"prompt": "d", "response": "{}", "category": "tool_trace", "lane": "vox_tooling"}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_parse_rate_and_nonempty_parse_rate_differ(tmp_path: Path):
    r = evaluate_file(_train(tmp_path))
    assert r["total_samples"] == 4 and r["code_samples"] == 3
    assert r["parse_rate"] == pytest.approx(2 / 3) and r["nonempty_parse_rate"] == pytest.approx(1 / 3)
    assert r["constructs_present"] == ["fn"] and r["construct_total"] == len(get_language("vox").construct_kinds)
    assert r["per_category"] == {"vox_fn": 2, "x": 1, "tool_trace": 1}


def test_feature_coverage_counts_tokens_of_parsing_code(tmp_path: Path):
    """Each keyword or decorator counts once per sample whose code parses and uses it as a token: not inside a
    string or a comment, not in code that does not parse."""
    vox = get_language("vox")
    code = ('@test\nfn adds() to Unit {\n    // while here is a comment\n    let s = "match in a string"\n'
            '    for x in [1] {\n        continue\n    }\n}\n')
    assert vox.parse(code).ok
    assert vox.features(code) == {"@test", "fn", "to", "let", "for", "in", "continue"}
    assert vox.features("fn broken( {  @rate_limit") == {"fn", "@rate_limit"}  # tokens, parse or not
    assert vox.features("\x00\uffff@@@") == set()
    assert vox.features("import std.http\nfn f() to int {\n    return r.http\n}\n") == {"import", "fn", "to", "return"}
    p = tmp_path / "f.jsonl"
    rows = [{"prompt": "a", "response": code}, {"prompt": "b", "response": GOOD},
            {"prompt": "c", "response": "@rate_limit fn broken( {"}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = evaluate_file(p)
    assert r["feature_counts"]["fn"] == 2 and r["feature_counts"]["@test"] == 1 and r["feature_counts"]["to"] == 2
    assert "while" in r["features_missing"] and "match" in r["features_missing"]  # comment and string only
    assert "@rate_limit" in r["features_missing"]  # only in code that does not parse
    assert r["feature_total"] == len(vox.feature_kinds) and r["feature_coverage"] == len(r["feature_counts"])
    py = get_language("python")
    assert py.features("for x in y:\n    pass  # while\ns = 'if'\n") == {"for", "in", "pass"}
    assert py.features("def f(:\n  (((") <= {"def"}


def test_gates_pass_and_fail(tmp_path: Path):
    gates = tmp_path / "g.yaml"
    gates.write_text("eval_local:\n  min_parse_rate: 0.5\n  min_coverage_pct: 0.01\n  block: true\n")
    assert eval_to_file(_train(tmp_path), tmp_path / "e.json", gates)["gates"]["passed"]
    gates.write_text("corpus:\n  min_nonempty_parse_rate: 0.9\n")
    with pytest.raises(GateFailed, match=r"min_nonempty_parse_rate: 0\.3333 < 0\.9"):
        eval_to_file(_train(tmp_path), tmp_path / "e.json", gates)
    assert json.loads((tmp_path / "e.json").read_text())["gates"]["passed"] is False


def test_generate_parses_covers_15_kinds_and_is_deterministic():
    rows, rep = generate_programs(120, seed=3)
    vox = get_language("vox")
    assert len(rows) == 120 and rep.rejected_unparsable == 0
    assert all(vox.parse(r["response"]).has_code for r in rows)
    assert len(rep.kinds) >= 15
    assert generate_programs(120, seed=3)[0] == rows
    assert generate_programs(120, seed=4)[0] != rows
    assert len({r["response"] for r in rows}) == 120 and all(r["prompt"].strip() for r in rows)
