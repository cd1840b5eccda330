"""Repair pairs (mens.corpus.repairs): the request shows code the parser rejects, with the parser's own error where
the wording quotes it, and the answer is the checked original; an edit that leaves valid code never makes a pair."""

import random
import re

import pytest

from mens.corpus import repairs
from mens.corpus.repairs import break_code, load_repairs, repair_pairs
from mens.corpus.requests import request_pairs
from mens.errors import ConfigError
from mens.lang import get_language

VOX = get_language("vox")
FENCED = re.compile(r"```vox\n(.*?)```", re.S)


def test_each_pair_asks_to_fix_code_the_parser_rejects_and_answers_with_the_checked_original():
    rows = request_pairs("vox")
    answers = {r["response"] for r in rows}
    out, report = repair_pairs(rows, 60, seed=0, lang=VOX)
    assert report.written == len(out) == 60 and sum(report.by_edit.values()) == 60
    assert len(report.by_edit) >= 5  # many kinds of mistake, not one
    for row in out:
        broken = FENCED.search(row["prompt"]).group(1)
        err = VOX.parse(broken).first_error
        assert err is not None, row["prompt"]
        if "line " in row["prompt"]:  # the wordings that quote the parser quote its first error
            assert f"line {err.line}, column {err.col}: {err.message}" in row["prompt"]
        assert row["response"] in answers and VOX.parse(row["response"]).ok
        assert broken != row["response"]
        assert row["origin"] == "repairs" and row["source"].startswith("repair:")
        edit = row["source"].split(":")[1]
        assert edit in report.by_edit
    assert len({r["source"].split(":", 2)[2] for r in out}) == 60  # each from another request


def test_the_same_seed_gives_the_same_pairs_and_another_seed_others():
    rows = request_pairs("vox")[:80]
    a, _ = repair_pairs(rows, 20, seed=3, lang=VOX)
    b, _ = repair_pairs(rows, 20, seed=3, lang=VOX)
    c, _ = repair_pairs(rows, 20, seed=4, lang=VOX)
    assert a == b and a != c


def test_code_no_edit_can_break_makes_no_pair():
    edits, _ = load_repairs("vox")
    unbreakable = "let limit = 3\n"  # no edit matches it
    assert break_code(unbreakable, VOX, random.Random(0), edits) is None
    still_valid = "fn f(a: int) to int {\n    return a\n}\n"
    only_arrow = [repairs.Edit("arrow", re.compile(r" to "), " -> ")]  # `->` only warns: the code stays valid
    assert break_code(still_valid, VOX, random.Random(0), only_arrow) is None
    row = {"prompt": "p", "response": unbreakable, "source": "x"}
    out, report = repair_pairs([row], 5, seed=0, lang=VOX)
    assert out == [] and report.skipped == 1 and report.written == 0


def test_a_bad_edits_file_is_refused_naming_the_entry(tmp_path, monkeypatch):
    (tmp_path / "vox.yaml").write_text("edits:\n  - name: x\n    find: '('\n    replace: ''\nprompts: ['fix']\n")
    monkeypatch.setattr(repairs, "REPAIRS_DIR", tmp_path)
    load_repairs.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"edits\[0\].*regular expression"):
            load_repairs("vox")
        with pytest.raises(ConfigError, match="expected .*klingon.yaml"):
            load_repairs("klingon")
    finally:
        load_repairs.cache_clear()


def test_corpus_repairs_breaks_the_answers_of_a_pairs_file_and_skips_what_is_not_code(tmp_path, capsys):
    import json

    from mens.cli.main import main

    inp = tmp_path / "pairs.jsonl"
    code = "fn double(x: int) to int {\n    return x * 2\n}\n"
    rows = [{"prompt": "p1", "response": f"Here it is:\n```vox\n{code}```\n", "source": "mine:1"},
            {"prompt": "p2", "response": "Vox has no classes; use a type."},  # prose: nothing to repair
            {"prompt": "p3", "response": "fn broken( {\n"}]  # code that does not parse: no fix to teach
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "repairs.jsonl"
    with pytest.raises(SystemExit) as e:
        main(["corpus", "repairs", "-i", str(inp), "-o", str(out), "--seed", "1"])
    assert e.value.code == 0
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["response"] == code and row["source"].endswith(":mine:1")  # the fenced code, not the prose
    assert "1 repair pairs" in capsys.readouterr().out
    _, report = repair_pairs([{"response": r["response"]} for r in rows], 5, 1, VOX)
    assert (report.written, report.not_code, report.skipped) == (1, 2, 0)
    with pytest.raises(SystemExit) as e:
        main(["corpus", "repairs", "-i", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "none.jsonl")])
    assert e.value.code != 0 and not (tmp_path / "none.jsonl").exists()
    assert "no such file" in capsys.readouterr().err
