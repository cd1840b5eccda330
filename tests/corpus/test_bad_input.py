"""Bad input never loses a record: every line ends in the output or in rejects with a reason and file:line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mens.corpus.extract import extract_to_file
from mens.corpus.pairs import build_pairs
from mens.corpus.validate import validate_file
from mens.errors import DataError


@pytest.fixture
def units(tmp_path: Path) -> Path:
    src = tmp_path / "a.vox"
    src.write_text("// @training_prompt: Add two numbers.\nfn add(a: int, b: int) to int {\n    return a + b\n}\n")
    (tmp_path / "b.vox").write_text("fn broken( {\n")
    out = tmp_path / "units.jsonl"
    extract_to_file([src, tmp_path / "b.vox"], out)
    return out


def _rows(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text(encoding="utf-8").splitlines()]


def test_validate_keeps_going_past_every_kind_of_bad_line(units: Path, tmp_path: Path):
    good = units.read_text().splitlines()
    missing = json.loads(good[0])
    del missing["code"]
    missing["kind"] = "file"
    missing["code"] = None
    with units.open("ab") as f:
        f.write(b'{"kind": "file", "code": \n')                    # malformed JSON
        f.write((json.dumps({k: v for k, v in json.loads(good[0]).items() if k != "source"}) + "\n").encode())
        f.write(b'{"prompt": "x", "response": "fn f() to int { return 1 }\xff"}\n')  # not UTF-8
        f.write(b'{"prompt": "' + b"a" * 10_000_000 + b'", "response": "fn f() {}"}\n')  # 10 MB line
        f.write(b"[1, 2]\n")
    inp_lines = len([x for x in units.read_bytes().splitlines() if x.strip()])
    rep = validate_file(units, tmp_path / "ok.jsonl", tmp_path / "rej.jsonl")
    rejects = _rows(tmp_path / "rej.jsonl")
    assert rep.n_in == inp_lines == rep.n_kept + len(rejects)
    reasons = {r["reason"] for r in rejects}
    assert {"malformed_json", "schema", "not_utf8", "line_too_long", "not_object", "parse_error"} <= reasons
    by_reason = {r["reason"]: r for r in rejects}
    assert by_reason["malformed_json"]["where"].endswith(f"units.jsonl:{len(good) + 1}")
    assert "'source'" in by_reason["schema"]["detail"] and "units.jsonl:" in by_reason["schema"]["detail"]
    assert len(by_reason["line_too_long"]["raw"]) > 10_000_000  # kept, not lost
    assert by_reason["parse_error"]["detail"].startswith("parse_error: ") and "b.vox:1:" in by_reason[
        "parse_error"]["detail"]
    assert rep.n_kept == 1 and _rows(tmp_path / "ok.jsonl")[0]["decls"] == [["fn", "add"]]


def test_empty_input_is_a_clear_data_error(tmp_path: Path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(DataError, match=r"empty\.jsonl: file is empty \(0 records"):
        validate_file(empty, tmp_path / "o.jsonl")
    with pytest.raises(DataError, match="empty"):
        build_pairs(empty, tmp_path / "t.jsonl")


def test_pairs_lists_bad_lines_in_rejects(units: Path, tmp_path: Path):
    validate_file(units, tmp_path / "v.jsonl")
    with (tmp_path / "v.jsonl").open("a") as f:
        f.write("{not json\n")
    rep = build_pairs(tmp_path / "v.jsonl", tmp_path / "t.jsonl", rejects=tmp_path / "r.jsonl")
    assert rep.n_in == rep.n_used + sum(rep.skipped.values()) == 2
    assert _rows(tmp_path / "r.jsonl")[0]["reason"] == "malformed_json"


def test_unreadable_source_file_is_reported_not_fatal(tmp_path: Path):
    (tmp_path / "bad.vox").write_bytes(b"fn f() {\xff}\n")
    (tmp_path / "ok.vox").write_text("fn g() to int {\n    return 1\n}\n")
    rep = extract_to_file([tmp_path], tmp_path / "u.jsonl")
    assert rep.units_new == 1 and "bad.vox" in rep.unreadable[0] and "UTF-8" in rep.unreadable[0]
