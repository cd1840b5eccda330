"""Parity with the upstream Vox parser on the shared corpus: files, doc blocks and 3,189 mutants."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from mens.lang.vox import parse_file_text


def doc_blocks(md_text: str) -> list[str]:
    """The ```vox fences of a page: content lines joined with newlines, plus a final newline."""
    lines = md_text.split("\n")
    blocks: list[str] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```vox":
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            blocks.append("\n".join(lines[i + 1 : j]) + "\n")
            i = j + 1
        else:
            i += 1
    return blocks


def load_rows(root: Path, table: str):
    pages: dict[str, list[str]] = {}
    for line in (root / table).read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row["kind"] == "file":
            text = (root / row["path"]).read_bytes().decode("utf-8", "replace")
        else:
            if row["path"] not in pages:
                pages[row["path"]] = doc_blocks((root / row["path"]).read_text(encoding="utf-8"))
            text = pages[row["path"]][row["block"] - 1]
            assert hashlib.sha256(text.encode()).hexdigest() == row["sha256"], (row["path"], row["block"])
        yield row, text


def check_rows(root: Path, table: str) -> tuple[list[str], int, int, int]:
    """(mismatch descriptions, rows, failing rows, failing rows whose first error line agrees)."""
    mismatches: list[str] = []
    rows = fails = lines_ok = 0
    for row, text in load_rows(root, table):
        rows += 1
        where = f"{row['path']}#{row.get('block', '')}"
        res = parse_file_text(text, row["path"], "module")
        if res.ok != row["parse_ok"]:
            mismatches.append(f"{where}: module ok={res.ok}, expected {row['parse_ok']} ({res.first_error})")
        elif res.ok and [list(d) for d in res.decls] != row.get("decls", []):
            mismatches.append(f"{where}: decls {res.decls} != {row.get('decls')}")
        if not row["parse_ok"]:
            fails += 1
            if res.first_error is not None and res.first_error.line == row["first_error"]["line"]:
                lines_ok += 1
        if "parse_ok_script_mode" in row:
            script = parse_file_text(text, row["path"], "script")
            if script.ok != row["parse_ok_script_mode"]:
                mismatches.append(f"{where}: script ok={script.ok}, expected {row['parse_ok_script_mode']}")
    return mismatches, rows, fails, lines_ok


def test_expected_table_parity(shared_vox):
    mismatches, rows, fails, lines_ok = check_rows(shared_vox, "expected_parse_results.jsonl")
    assert rows == 492
    assert mismatches == []
    assert lines_ok / fails >= 0.95, f"first-error line agrees on {lines_ok}/{fails}"


def test_mutant_parity(shared_vox):
    mismatches, rows, fails, lines_ok = check_rows(shared_vox, "mutants/expected.jsonl")
    assert rows == 3189
    assert mismatches == []
    assert lines_ok / fails >= 0.95, f"first-error line agrees on {lines_ok}/{fails}"


def test_ci_must_parse_blocks_parse(shared_vox):
    for row, text in load_rows(shared_vox, "expected_parse_results.jsonl"):
        if row.get("ci_must_parse"):
            assert parse_file_text(text, row["path"]).ok, row["path"]
