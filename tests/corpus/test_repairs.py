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
