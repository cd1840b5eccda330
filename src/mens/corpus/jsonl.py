"""Reading and writing JSONL without losing a line: every non-blank line is a record or a `BadLine`.

Bad lines (not UTF-8, malformed JSON, not an object, longer than the trainer accepts) keep their raw text so
that the rejects file holds them. Run: used by every `mens corpus` command that reads JSONL.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from mens.corpus.records import MAX_LINE_BYTES, BadLine
from mens.errors import DataError, UsageError


def read_objects(path: str | Path) -> Iterator[tuple[int, dict | BadLine]]:
    """Yield `(line_no, dict | BadLine)` for each non-blank line; never raises on content."""
    path = Path(path)
    with path.open("rb") as f:
        for no, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            if len(raw) > MAX_LINE_BYTES:
                reason = f"line_too_long: {len(raw)} bytes > {MAX_LINE_BYTES} allowed (the trainer's limit)"
                yield no, BadLine(str(path), no, reason, raw.decode("utf-8", "replace").rstrip("\n"))
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                reason = f"not_utf8: invalid byte 0x{raw[e.start]:02x} at column {e.start + 1}"
                yield no, BadLine(str(path), no, reason, raw.decode("utf-8", "replace").rstrip("\n"))
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                yield no, BadLine(str(path), no, f"malformed_json: {e.msg} (col {e.colno})", text.rstrip("\n"))
                continue
            if not isinstance(obj, dict):
                reason = f"not_object: expected a JSON object, got {type(obj).__name__}"
                yield no, BadLine(str(path), no, reason, text.rstrip("\n"))
                continue
            yield no, obj


def reason_code(reason: str) -> str:
    """The short reason key of a BadLine/reject reason (`malformed_json: …` -> `malformed_json`)."""
    return reason.split(":", 1)[0]


def require_input(path: str | Path, stage: str) -> Path:
    """`path` as a Path; UsageError if missing, DataError if it holds no non-blank line."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{path}: no such file; `mens corpus {stage}` needs an existing JSONL input")
    with path.open("rb") as f:
        if not any(line.strip() for line in f):
            raise DataError(f"{path}: file is empty (0 records, expected at least 1); "
                            f"run the previous stage again or point `mens corpus {stage}` at another file")
    return path


def dumps(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def write_jsonl(path: str | Path, rows: Iterable[dict], append: bool = False) -> int:
    """Write rows (one compact JSON object a line); atomic (temp file + rename) unless appending."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    if append:
        with path.open("a", encoding="utf-8") as f:
            for row in rows:
                f.write(dumps(row) + "\n")
                n += 1
        return n
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(dumps(row) + "\n")
            n += 1
    os.replace(tmp, path)
    return n


def reject_row(reason: str, where: str, record: dict | None = None, raw: str | None = None, **extra) -> dict:
    """One rejects-file row: why, where (file:line), and the record (or the raw line when it did not parse)."""
    row = {"reason": reason_code(reason), "detail": reason, "where": where}
    row.update(extra)
    if record is not None:
        row["record"] = record
    if raw is not None:
        row["raw"] = raw
    return row
