"""Bad-input matrix: every hostile input through every corpus command and the trainer's reader.

For each (command, input): no traceback (exit 0/1/2 through the real entry point), done in under 2 s, counts
reconcile (in = kept + rejected) and every reject carries a reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hostile_inputs import (
    GOOD_CODE,
    HANG_LIMIT_S,
    JSONL_FAULTS,
    fifo,
    md_faults,
    read_rows,
    run_cli,
    source_faults,
    sparse_file,
    write_jsonl_faults,
)

from mens.corpus.limits import MAX_SOURCE_FILE_BYTES
from mens.errors import DataError

FAULTS = sorted(JSONL_FAULTS)
BAD_ROWS = [f for f in FAULTS if f != "fence_bomb"]
"""Faults that make a row invalid; the fence bomb is a valid pair whose response is slow to scan, not bad."""


def _ok(code: int, out: str, took: float, allowed=(0,)) -> None:
    assert code in allowed, out
    assert "Traceback" not in out
    assert took < HANG_LIMIT_S, f"took {took:.2f} s"


def _check_rejects(rejects: list[dict]) -> None:
    for r in rejects:
        assert r["reason"] and r["detail"] and r["where"], r


@pytest.mark.parametrize("fault", FAULTS)
def test_validate_rejects_each_fault_with_a_reason(tmp_path: Path, capsys, fault: str):
    inp = write_jsonl_faults(tmp_path / "in.jsonl", [fault])
    rep_path = tmp_path / "rep.json"
    code, out, took = run_cli(capsys, "corpus", "validate", inp, "-o", tmp_path / "ok.jsonl",
                              "--rejects", tmp_path / "rej.jsonl", "--report", rep_path)
    _ok(code, out, took)
    rep = json.loads(rep_path.read_text())
    kept, rejects = read_rows(tmp_path / "ok.jsonl"), read_rows(tmp_path / "rej.jsonl")
    assert rep["total_input_records"] == 2 == len(kept) + len(rejects) and rep["reconciled"]
    assert len(kept) == 1 and len(rejects) == 1  # the fault is the one rejected, the good row survives
    _check_rejects(rejects)
    assert rejects[0]["where"].endswith("in.jsonl:2")


@pytest.mark.parametrize("fault", FAULTS)
def test_pairs_rejects_each_fault_with_a_reason(tmp_path: Path, capsys, fault: str):
    inp = write_jsonl_faults(tmp_path / "in.jsonl", [fault])
    code, out, took = run_cli(capsys, "corpus", "pairs", inp, "-o", tmp_path / "t.jsonl",
                              "--rejects", tmp_path / "rej.jsonl")
    _ok(code, out, took)
    rejects = read_rows(tmp_path / "rej.jsonl")
    _check_rejects(rejects)
    meta = json.loads((tmp_path / "t.metadata.json").read_text())
    skipped = sum(meta["skipped"].values())
    assert f"records in 2 = used {2 - skipped} + skipped {skipped}" in out
    assert skipped == len(rejects) and meta["total_pairs"] == 2 - skipped
    assert skipped == (0 if fault == "fence_bomb" else 1)  # a pair passes through unparsed; `validate` checks it


@pytest.mark.parametrize("fault", FAULTS)
def test_eval_counts_each_fault_as_bad(tmp_path: Path, capsys, fault: str):
    inp = write_jsonl_faults(tmp_path / "in.jsonl", [fault])
    code, out, took = run_cli(capsys, "corpus", "eval", inp, "-o", tmp_path / "e.json")
    _ok(code, out, took)
    res = json.loads((tmp_path / "e.json").read_text())
    assert res["total_samples"] == 2
    good = res["total_samples"] - res["bad_lines"]
    assert sum(res["bad_by_reason"].values()) == res["bad_lines"]
    assert sum(res["per_category"].values()) == good  # every row is either counted or bad, with a reason
    if fault != "fence_bomb":  # the fence bomb is a well-formed row whose response does not parse
        assert res["bad_lines"] == 1


@pytest.mark.parametrize("fault", FAULTS)
def test_mix_accounts_for_each_fault(tmp_path: Path, capsys, fault: str):
    write_jsonl_faults(tmp_path / "in.jsonl", [fault])
    (tmp_path / "mix.yaml").write_text("sources:\n  - {path: in.jsonl, weight: 2}\noutput: mixed.jsonl\n")
    code, out, took = run_cli(capsys, "corpus", "mix", "-c", tmp_path / "mix.yaml", "--base", tmp_path)
    _ok(code, out, took)
    rep = json.loads((tmp_path / "mixed.mix_report.json").read_text())
    s = rep["sources"][0]
    assert s["input_lines"] == 2 == s["kept_lines"] + s["bad_lines"] + s["filtered_by_lane"] + s["sampled_out"]
    assert len(read_rows(tmp_path / "mixed.jsonl")) == 2 * s["kept_lines"]
    if s["bad_lines"]:
        rejects = read_rows(tmp_path / "mixed.rejects.jsonl")
        assert len(rejects) == s["bad_lines"] == sum(s["rejected_by_reason"].values())
        _check_rejects(rejects)


@pytest.mark.parametrize("fault", FAULTS)
def test_requests_file_names_the_bad_line(tmp_path: Path, capsys, fault: str):
    inp = write_jsonl_faults(tmp_path / "req.jsonl", [fault], good=0)
    code, out, took = run_cli(capsys, "corpus", "requests", "-o", tmp_path / "o.jsonl", "--file", inp)
    _ok(code, out, took, allowed=(2,))
    assert "req.jsonl:1" in out and len(out.strip().splitlines()) == 1
    assert not (tmp_path / "o.jsonl").exists()  # all or nothing: the documented policy of `requests`


@pytest.mark.parametrize("fault", FAULTS)
def test_repairs_input_names_the_bad_line_and_writes_nothing(tmp_path: Path, capsys, fault: str):
    inp = write_jsonl_faults(tmp_path / "pairs.jsonl", [fault], good=0)
    code, out, took = run_cli(capsys, "corpus", "repairs", "-o", tmp_path / "o.jsonl", "-i", inp)
    if fault == "fence_bomb":  # a valid row whose answer holds no code: nothing to repair, nothing refused
        _ok(code, out, took)
        assert "0 repair pairs" in out and "1 answers without code" in out
        return
    _ok(code, out, took, allowed=(2,))
    assert "pairs.jsonl:1" in out and len(out.strip().splitlines()) == 1
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize("fault", BAD_ROWS)
def test_train_reader_gives_one_line_error_with_file_and_line(tmp_path: Path, fault: str):
    from mens.train.data import read_examples

    inp = write_jsonl_faults(tmp_path / "train.jsonl", [fault, fault], good=0)
    with pytest.raises(DataError) as info:  # no good row: the tokenizer is never reached
        read_examples(inp, None, seq_len=64, ce_last_k=0, system_prompt=None, min_rating=1)
    msg = str(info.value)
    assert "\n" not in msg and "2 of 2 lines" in msg
    assert "train.jsonl:1: " in msg and "train.jsonl:2: " in msg


def test_all_faults_together_reconcile_in_every_command(tmp_path: Path, capsys):
    inp = write_jsonl_faults(tmp_path / "in.jsonl", FAULTS, good=3)
    n = 3 + len(FAULTS)
    code, out, took = run_cli(capsys, "corpus", "validate", inp, "-o", tmp_path / "v.jsonl")
    _ok(code, out, took)
    assert len(read_rows(tmp_path / "v.jsonl")) + len(read_rows(tmp_path / "v.rejects.jsonl")) == n
    code, out, took = run_cli(capsys, "corpus", "pairs", inp, "-o", tmp_path / "t.jsonl")
    _ok(code, out, took)
    assert f"records in {n} = used 4 + skipped {n - 4}" in out  # 3 good rows and the (valid) fence bomb


def test_a_huge_jsonl_file_is_refused_before_it_is_read(tmp_path: Path, capsys, monkeypatch):
    from mens.corpus import jsonrow

    big = sparse_file(tmp_path / "big.jsonl", 3 << 20)  # one 3 MB "line" of NUL bytes, no newline
    monkeypatch.setattr(jsonrow, "MAX_JSONL_FILE_BYTES", 2 << 20)
    for args in (["validate", big, "-o", tmp_path / "o.jsonl"], ["pairs", big, "-o", tmp_path / "t.jsonl"],
                 ["eval", big, "-o", tmp_path / "e.json"]):
        code, out, took = run_cli(capsys, "corpus", *args)
        _ok(code, out, took, allowed=(2,))
        assert f"{3 << 20} bytes > {2 << 20} allowed" in out
    monkeypatch.undo()
    code, out, took = run_cli(capsys, "corpus", "validate", big, "-o", tmp_path / "o.jsonl")
    _ok(code, out, took)  # under the cap: one over-long line, rejected with its size, read in bounded chunks
    assert read_rows(tmp_path / "o.rejects.jsonl")[0]["reason"] == "line_too_long"


def _tree(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """An input folder holding every hostile source/markdown file, links and a FIFO, plus one good file."""
    root = tmp_path / "src"
    root.mkdir()
    outside = tmp_path / "secret.vox"
    outside.write_text(GOOD_CODE.replace("add", "secret"))
    (tmp_path / "outdir").mkdir()
    (tmp_path / "outdir" / "x.vox").write_text(GOOD_CODE)
    files = {**md_faults(), **source_faults(), "good.vox": GOOD_CODE}
    for name, text in files.items():
        (root / name).write_text(text, encoding="utf-8")
    (root / "binary.vox").write_bytes(b"fn f() {\x00}\n")
    (root / "latin1.vox").write_bytes(b"// caf\xe9\n" + GOOD_CODE.encode())
    sparse_file(root / "huge.vox", 50 << 20)
    (root / "escape.vox").symlink_to(outside)
    (root / "escape_dir").symlink_to(tmp_path / "outdir")
    (root / "loop.vox").symlink_to(root / "loop.vox")
    (root / "broken.md").symlink_to(tmp_path / "nowhere.md")
    (root / "inside.vox").symlink_to(root / "good.vox")
    (root / "sub").mkdir()
    (root / "sub" / "deeper.vox").write_text(GOOD_CODE.replace("add", "deeper"))
    (root / "sub_link").symlink_to(root / "sub")
    fifo(root / "pipe.vox")
    expected = {"binary.vox": "binary_file", "latin1.vox": "not_utf8", "huge.vox": "file_too_large",
                "escape.vox": "symlink_outside_input", "escape_dir": "symlink_outside_input",
                "sub_link": "symlink_dir", "loop.vox": "symlink_loop",
                "broken.md": "symlink_broken", "pipe.vox": "not_regular_file"}
    return root, expected


def test_extract_refuses_hostile_files_with_reasons_and_finishes_fast(tmp_path: Path, capsys):
    root, expected = _tree(tmp_path)
    out = tmp_path / "units.jsonl"
    code, text, took = run_cli(capsys, "corpus", "extract", root, "-o", out)
    _ok(code, text, took)
    rejects = {r["where"].split("/", 1)[1]: r for r in read_rows(tmp_path / "units.rejects.jsonl")}
    assert {k: r["reason"] for k, r in rejects.items()} == expected
    _check_rejects(list(rejects.values()))
    assert str(MAX_SOURCE_FILE_BYTES) in rejects["huge.vox"]["detail"]
    units = read_rows(out)
    assert not any("secret" in u["code"] for u in units)  # nothing from outside the input tree
    sources = {u["source"].split("/", 1)[1] for u in units}
    pages = {*md_faults(), *source_faults()} - {"unclosed_fences.md"}  # that page holds no closed vox block
    assert {"good.vox", "sub/deeper.vox", *pages} <= sources  # each page still yields units
    assert "inside.vox" not in rejects and "1 already present" in text  # a link inside: read, same sha256
    for u in units:
        json.dumps(u, ensure_ascii=False).encode("utf-8")  # every unit can be written back (no lone surrogate)
    n_files = len(os.listdir(root)) + 1 - 3  # + sub/deeper.vox - the folder sub and the two folder links
    n_refused = len(expected) - 2
    assert f"files: {n_files + 2} = read {n_files - n_refused} " in text


@pytest.mark.parametrize("name", sorted({**md_faults(), **source_faults()}))
def test_each_pathological_page_or_source_is_fast(tmp_path: Path, capsys, name: str):
    text = {**md_faults(), **source_faults()}[name]
    (tmp_path / name).write_text(text, encoding="utf-8")
    code, out, took = run_cli(capsys, "corpus", "extract", tmp_path / name, "-o", tmp_path / "u.jsonl")
    _ok(code, out, took)
    if name == "unclosed_fences.md":  # no closed block, no unit: the next stage says so in one line
        assert read_rows(tmp_path / "u.jsonl") == []
        return
    code, out, took = run_cli(capsys, "corpus", "validate", tmp_path / "u.jsonl", "-o", tmp_path / "v.jsonl")
    _ok(code, out, took)
    if not read_rows(tmp_path / "v.jsonl"):  # deep_braces.vox does not parse: rejected with the parser's reason
        assert read_rows(tmp_path / "v.rejects.jsonl")[0]["reason"] == "parse_error"
        return
    code, out, took = run_cli(capsys, "corpus", "pairs", tmp_path / "v.jsonl", "-o", tmp_path / "t.jsonl",
                              "--docs", tmp_path)
    _ok(code, out, took)


def test_pairs_docs_refuses_escaping_links(tmp_path: Path, capsys):
    root, _ = _tree(tmp_path)
    inp = write_jsonl_faults(tmp_path / "in.jsonl", [])
    code, out, took = run_cli(capsys, "corpus", "pairs", inp, "-o", tmp_path / "t.jsonl", "--docs", root)
    _ok(code, out, took)
    assert "--docs file refused: src/broken.md: symlink_broken" in out


@pytest.mark.parametrize(("yaml_text", "needle"), [
    ("sources: 5\noutput: o.jsonl\n", "sources = 5"),
    ("sources:\n  - {path: in.jsonl, weight: abc}\noutput: o.jsonl\n", "sources[0].weight = 'abc'"),
    ("sources:\n  - {path: in.jsonl, weight: .inf}\noutput: o.jsonl\n", "sources[0].weight = inf"),
    ("sources:\n  - {path: in.jsonl, weight: .nan}\noutput: o.jsonl\n", "sources[0].weight = nan"),
    ("sources:\n  - {path: in.jsonl, weight: 1e12}\noutput: o.jsonl\n", "less than or equal to 100"),
    ("sources:\n  - {path: in.jsonl, weight: -1}\noutput: o.jsonl\n", "sources[0].weight = -1"),
    ("sources:\n  - {path: [a], weight: 1}\noutput: o.jsonl\n", "sources[0].path = ['a']"),
    ("sources:\n  - {path: in.jsonl, sample_rate: 7}\noutput: o.jsonl\n", "sources[0].sample_rate = 7"),
    ("sources:\n  - {path: in.jsonl, optional: maybe}\noutput: o.jsonl\n", "sources[0].optional = 'maybe'"),
    ("sources:\n  - in.jsonl\noutput: o.jsonl\n", "sources[0] = 'in.jsonl'"),
    ("sources:\n  - {path: in.jsonl}\noutput: {a: 1}\n", "output = {'a': 1}"),
    ("sources:\n  - {path: in.jsonl}\noutput: o.jsonl\nseed: x\n", "seed = 'x'"),
    ("sources:\n  - {path: in.jsonl}\noutput: o.jsonl\nmax_output_rows: 1e15\n", "max_output_rows"),
    ("sources:\n  - {path: in.jsonl}\noutput: o.jsonl\nbogus: 1\n", "bogus"),
    ("- just a list\n", "got list"),
    ("a: &a [1]\nb: *a\n", "aliases"),
    ("sources: " + "[" * 3000 + "]" * 3000 + "\n", "nest more than 64 levels"),
    ("sources: [\n", "not valid YAML"),
])
def test_mix_config_errors_are_one_line_config_errors(tmp_path: Path, capsys, yaml_text: str, needle: str):
    write_jsonl_faults(tmp_path / "in.jsonl", [])
    (tmp_path / "mix.yaml").write_text(yaml_text)
    code, out, took = run_cli(capsys, "corpus", "mix", "-c", tmp_path / "mix.yaml", "--base", tmp_path)
    _ok(code, out, took, allowed=(2,))
    assert needle in out and len(out.strip().splitlines()) == 1, out
    assert not (tmp_path / "o.jsonl").exists()


def test_mix_output_is_bounded(tmp_path: Path, capsys):
    write_jsonl_faults(tmp_path / "in.jsonl", [], good=50)
    (tmp_path / "mix.yaml").write_text("sources:\n  - {path: in.jsonl, weight: 100}\noutput: o.jsonl\n"
                                       "max_output_rows: 1000\n")
    code, out, took = run_cli(capsys, "corpus", "mix", "-c", tmp_path / "mix.yaml", "--base", tmp_path)
    _ok(code, out, took, allowed=(2,))
    assert "5000 rows > max_output_rows 1000" in out and not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize("doc", ['{"results": [1, "x", {"samples": 5}, {"samples": [3, {"failures": 7}]}]}',
                                 "[" * 5000 + "]" * 5000, '{"results": "\\ud800"}', "\x00"])
def test_generate_focus_file_of_wrong_shape(tmp_path: Path, capsys, doc: str):
    (tmp_path / "bench.json").write_text(doc)
    code, out, took = run_cli(capsys, "corpus", "generate", "-n", "3", "--focus", tmp_path / "bench.json",
                              "-o", tmp_path / "g.jsonl")
    assert code in (0, 2) and "Traceback" not in out, out


@pytest.mark.parametrize("gates", ["corpus: {min_parse_rate: abc}\n", "corpus: {min_rows: [1]}\n",
                                   "corpus: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n"])
def test_eval_gates_of_wrong_type_are_config_errors(tmp_path: Path, capsys, gates: str):
    inp = write_jsonl_faults(tmp_path / "in.jsonl", [])
    (tmp_path / "g.yaml").write_text(gates)
    code, out, took = run_cli(capsys, "corpus", "eval", inp, "-o", tmp_path / "e.json", "--gates", tmp_path / "g.yaml")
    _ok(code, out, took, allowed=(2,))
    assert "g.yaml" in out and len(out.strip().splitlines()) == 1


def test_real_process_prints_no_traceback(tmp_path: Path):
    inp = write_jsonl_faults(tmp_path / "in.jsonl", FAULTS)
    cmd = [sys.executable, "-m", "mens", "corpus", "validate", str(inp), "-o", str(tmp_path / "v.jsonl")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "Traceback" not in res.stderr + res.stdout
    assert f"in {len(FAULTS) + 1} = kept 1 + rejected {len(FAULTS)}" in res.stdout
