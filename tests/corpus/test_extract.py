"""Extract: headers, ANCHOR regions, declarations with line spans, markdown blocks, incremental append."""

from __future__ import annotations

import json
from pathlib import Path

from mens.corpus.extract import extract_to_file
from mens.corpus.golden_header import parse_header, strip_marker_lines
from mens.corpus.markdown import iter_blocks, parse_frontmatter
from mens.corpus.units import sha256_text

GOLDEN = """// ---
// title: "Demo"
// description: "Two functions."
// constructs: [fn, @endpoint(kind: query)]
// training_eligible: true
// ---
// @training_prompt: Write two small Vox functions.
// ANCHOR: display
// Adds one.
fn inc(x: int) to int {
    return x + 1
}

fn twice(x: int) to int {
    return x * 2
}
// ANCHOR_END: display
"""

DOC = """---
title: "Guide"
training_eligible: true
---
# Guide

## Counting

Counting things is easy: call `inc`.

```vox
fn inc(x: int) to int {
    return x + 1
}
```

```vox
// vox:skip
fn old() -> int { 1 }
```
"""


def test_header_fields_and_stripping():
    h = parse_header(GOLDEN)
    assert h.training_prompt == "Write two small Vox functions."
    assert h.constructs == ["fn", "@endpoint(kind: query)"] and h.training_eligible
    assert h.anchors == {"display": (9, 16)}
    clean = strip_marker_lines(GOLDEN)
    assert clean.startswith("// Adds one.\nfn inc") and "ANCHOR" not in clean and "title" not in clean
    assert not parse_header("// ---\n// training_eligible: false\n// ---\nfn f() {}\n").training_eligible


def test_units_record_path_span_and_sha(tmp_path: Path):
    f = tmp_path / "demo.vox"
    f.write_text(GOLDEN)
    out = tmp_path / "u.jsonl"
    rep = extract_to_file([tmp_path], out)
    units = [json.loads(x) for x in out.read_text().splitlines()]
    kinds = [u["kind"] for u in units]
    assert kinds.count("file") == 1 and kinds.count("decl") == 2 and rep.units_new == len(units)
    lines = GOLDEN.splitlines()
    for u in units:
        assert u["sha256"] == sha256_text(u["code"])
        if u["kind"] == "decl":
            assert u["code"] == "\n".join(lines[u["line_start"] - 1 : u["line_end"]]) + "\n"
    inc = next(u for u in units if u["kind"] == "decl" and u["decls"] == [["fn", "inc"]])
    assert (inc["line_start"], inc["line_end"], inc["description"]) == (10, 12, "Adds one.")
    assert inc["signature"] == "fn inc(x: int) to int" and inc["source"].endswith("/demo.vox")


def test_extract_is_incremental(tmp_path: Path):
    (tmp_path / "a.vox").write_text(GOLDEN)
    out = tmp_path / "u.jsonl"
    first = extract_to_file([tmp_path], out).units_new
    assert extract_to_file([tmp_path], out).units_new == 0
    (tmp_path / "b.vox").write_text("fn extra(y: int) to int {\n    return y\n}\n")
    again = extract_to_file([tmp_path], out)
    assert again.units_new == 1 and len(out.read_text().splitlines()) == first + 1


def test_markdown_blocks_context_and_skip_markers(tmp_path: Path):
    meta, body = parse_frontmatter(DOC)
    assert meta["title"] == "Guide" and body == 5
    blocks = iter_blocks(DOC, ("vox",))
    assert [b.first_line for b in blocks] == [12, 18]
    assert blocks[0].heading == "Counting" and "Counting things is easy" in blocks[0].context
    assert blocks[1].skip_markers == ["vox:skip"]
    (tmp_path / "guide.md").write_text(DOC)
    out = tmp_path / "u.jsonl"
    extract_to_file([tmp_path], out)
    units = [json.loads(x) for x in out.read_text().splitlines()]
    assert [u["kind"] for u in units] == ["doc_block", "doc_block"] and units[1]["skip_markers"] == ["vox:skip"]


def test_no_path_extracts_the_embedded_corpus(tmp_path: Path):
    rep = extract_to_file([], tmp_path / "u.jsonl")
    assert rep.files["source"] >= 40 and rep.units_found["file"] >= 40
