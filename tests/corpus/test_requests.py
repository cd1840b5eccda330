"""The shipped hand-written requests: every answer parses and meets its own checks, the wording varies, and none of
them comes near a task the bench reports on (held-out split) or the confirmation split. Needs only the package."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from mens.corpus.requests import load_requests, request_pairs, requests_path
from mens.dogfood.heldout import decontaminate, heldout_tasks
from mens.errors import DataError
from mens.evaluate.bench import load_bench, load_references

CONFIRM = Path(__file__).parents[2] / "bench" / "confirm" / "vox_confirm.jsonl"
FEATURES = Path(__file__).parents[2] / "bench" / "features" / "vox_features.jsonl"
REQUESTS = load_requests("vox")  # raises, naming the line, if any answer fails its own checks


def test_shipped_requests_are_many_varied_and_cover_the_bench_categories():
    assert requests_path("vox") is not None and len(REQUESTS) >= 300
    assert len({r.id for r in REQUESTS}) == len(REQUESTS)
    cats = Counter(r.category for r in REQUESTS)
    bench_cats = {t.category for t in load_bench()}
    assert set(cats) <= bench_cats, set(cats) - bench_cats
    assert len(cats) >= 15, cats
    assert all(r.expect.decls or r.expect.kinds for r in REQUESTS)
    text = " ".join(r.prompt.lower() for r in REQUESTS)
    for word in ("action", "page", "handler", "model", "schema", "route", "cron", "unit test", "enum", "struct"):
        assert word in text, word
    # Not one phrasing: many distinct first words, and most prompts do not say "Vox".
    assert len({r.prompt.split()[0].lower() for r in REQUESTS}) >= 30
    assert sum("vox" not in r.prompt.lower() for r in REQUESTS) >= len(REQUESTS) // 3


@pytest.mark.parametrize("split_name", ["heldout", "confirm", "features"])
def test_requests_stay_apart_from_the_tasks_models_are_judged_on(split_name):
    if split_name == "heldout":
        tasks, refs = heldout_tasks(None, "heldout")
    else:
        split = CONFIRM if split_name == "confirm" else FEATURES
        tasks, refs = load_bench(split), load_references(split)
    kept, report = decontaminate(request_pairs("vox"), tasks, refs)
    assert report.dropped == [], report.dropped[:3]
    assert report.max_prompt_similarity < 0.3
    assert len(kept) == len(REQUESTS)
    assert not {r.id for r in REQUESTS} & {t.id for t in tasks}


def test_a_request_whose_answer_fails_its_checks_is_named_with_its_line(tmp_path):
    good = {"id": "rq-ok", "category": "fn", "prompt": "Write double(n: int) to int.",
            "expect": {"decls": [["fn", "double"]], "returns": {"double": "int"}},
            "answer": "fn double(n: int) to int {\n    return n * 2\n}\n"}
    wrong = {**good, "id": "rq-wrong", "answer": "fn twice(n: int) to int {\n    return n * 2\n}\n"}
    p = tmp_path / "vox.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in (good, wrong, {"id": "rq-bad"})) + "\n")
    with pytest.raises(DataError) as e:
        load_requests("vox", p)
    msg = str(e.value)
    assert f"{p}:2: rq-wrong" in msg and "expected fn 'double'" in msg
    assert f"{p}:3: missing field 'category'" in msg
    p.write_text(json.dumps(good) + "\n")
    (pair,) = request_pairs("vox", p)
    assert pair["response"] == good["answer"] and pair["origin"] == "requests" and pair["source"] == "requests:rq-ok"


def test_corpus_requests_writes_pairs_or_names_the_bad_line(tmp_path, capsys):
    from mens.cli.main import main

    out = tmp_path / "requests_pairs.jsonl"
    with pytest.raises(SystemExit) as e:
        main(["corpus", "requests", "-o", str(out)])
    assert e.value.code == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == len(REQUESTS) and f"{len(rows)} requests (" in capsys.readouterr().out
    bad = tmp_path / "mine.jsonl"
    bad.write_text(json.dumps({"id": "x", "category": "fn", "prompt": "p", "expect": {"decls": [["fn", "f"]]},
                               "answer": "fn f( {\n"}) + "\n")
    with pytest.raises(SystemExit) as e:
        main(["corpus", "requests", "--file", str(bad), "-o", str(tmp_path / "none.jsonl")])
    assert e.value.code != 0 and not (tmp_path / "none.jsonl").exists()
    assert f"{bad}:1: x: the answer fails its own checks: does not parse" in capsys.readouterr().err
