"""End to end on the shared Vox corpus: extract -> validate -> pairs -> eval, with every count reconciled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mens.corpus.decl_split import split_decls
from mens.corpus.eval import eval_to_file
from mens.corpus.extract import extract_to_file
from mens.corpus.golden_header import strip_marker_lines
from mens.corpus.markdown import page_eligible, parse_frontmatter
from mens.corpus.normalize import normalize_code
from mens.corpus.pairs import build_pairs
from mens.corpus.records import TrainPair, read_pairs
from mens.corpus.validate import validate_file
from mens.lang import get_language


@pytest.fixture(scope="module")
def run(shared_vox: Path, tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("pipeline")
    ex = extract_to_file([shared_vox / "examples", shared_vox / "docs"], d / "units.jsonl")
    va = validate_file(d / "units.jsonl", d / "validated.jsonl", d / "rejects.jsonl")
    pa = build_pairs(d / "validated.jsonl", d / "train.jsonl", multi_turn=True)
    ev = eval_to_file(d / "train.jsonl", d / "eval.json",
                      gates=shared_vox / "mens-reference/config/eval-gates.yaml")
    expected = [json.loads(line) for line in (shared_vox / "expected_parse_results.jsonl").open()]
    pairs = [p for _, p in read_pairs(d / "train.jsonl")]
    return {"dir": d, "extract": ex, "validate": va, "pairs": pa, "eval": ev, "expected": expected,
            "pair_rows": pairs, "root": shared_vox}


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.open(encoding="utf-8")]


def test_pipeline_counts_reconcile_at_every_stage(run):
    d = run["dir"]
    ex, va, pa = run["extract"], run["validate"], run["pairs"]
    assert sum(ex.units_found.values()) == ex.units_new + ex.units_already_present
    assert len(_lines(d / "units.jsonl")) == ex.units_new == va.n_in
    assert va.n_in == va.n_kept + sum(va.rejected.values())
    assert len(_lines(d / "validated.jsonl")) == va.n_kept
    assert len(_lines(d / "rejects.jsonl")) == sum(va.rejected.values())
    assert pa.n_in == va.n_kept == pa.n_used + sum(pa.skipped.values())
    assert run["eval"]["total_samples"] == pa.n_pairs == len(run["pair_rows"])
    assert set(va.rejected) <= {"duplicate_exact", "duplicate_normalized", "no_code", "not_training_eligible",
                                "skip_marker", "parse_error"}


def test_every_training_response_parses(run):
    vox = get_language("vox")
    assert run["pair_rows"] and all(isinstance(p, TrainPair) for p in run["pair_rows"])
    for p in run["pair_rows"]:
        answers = [m.content for m in p.messages if m.role == "assistant"] if p.messages else [p.response]
        for a in answers:
            assert vox.parse(a).has_code, (p.source, a[:200])
            assert "@training_prompt" not in a and "ANCHOR" not in a and not a.startswith("// ---")
    assert run["eval"]["parse_rate"] == run["eval"]["nonempty_parse_rate"] == 1.0


def test_a_pair_exists_for_every_golden_file_doc_block_and_declaration(run):
    vox, root = get_language("vox"), run["root"]
    sources = {p.source.rsplit(":", 1)[0] for p in run["pair_rows"] if p.source}
    responses = " || ".join(normalize_code(p.response or "") for p in run["pair_rows"])
    files = [r for r in run["expected"] if r["kind"] == "file" and r["path"].startswith("examples/")]
    assert len(files) == 73
    for r in files:
        assert r["path"] in sources, f"no pair for golden {r['path']}"
        text = (root / r["path"]).read_text(encoding="utf-8")
        for s in split_decls(vox, text):
            if s.end_line - s.start_line + 1 >= 3:
                assert normalize_code(strip_marker_lines(s.code)) in responses, (r["path"], s.decls)
    n_blocks = 0
    rejects = {(x["record"]["source"], x["record"]["line_start"]): x["reason"]
               for x in _lines(run["dir"] / "rejects.jsonl") if "record" in x}
    for r in run["expected"]:
        if r["kind"] != "doc_block" or not r["parse_ok"] or r["skip_markers"]:
            continue
        meta, _ = parse_frontmatter((root / r["path"]).read_text(encoding="utf-8"))
        if page_eligible(meta, r["path"])[0]:
            n_blocks += 1
            code = (root / r["path"]).read_text(encoding="utf-8").splitlines()
            block = "\n".join(code[r["first_line"] - 1 : r["first_line"] - 1 + code[r["first_line"] - 1:].index("```")])
            assert normalize_code(block) in responses, f"no pair for {r['path']} block {r['block']}"
        else:  # ineligible pages are not trained on, but are accounted for in the rejects file
            assert rejects[(r["path"], r["first_line"])] == "not_training_eligible"
    assert n_blocks >= 20


def test_rerunning_extract_appends_nothing(run, shared_vox):
    units = run["dir"] / "units.jsonl"
    before = units.read_bytes()
    again = extract_to_file([shared_vox / "examples", shared_vox / "docs"], units)
    assert again.units_new == 0 and units.read_bytes() == before
