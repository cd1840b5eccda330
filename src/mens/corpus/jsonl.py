"""Reading and writing JSONL without losing a line: every non-blank line is a record or a `BadLine`.

Bad lines (not UTF-8, malformed or too deeply nested JSON, not an object, lone surrogates or NUL characters,
longer than the trainer accepts) keep their raw text so that the rejects file holds them. Writes are atomic.
Run: used by every `mens corpus` command that reads or writes JSONL.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from mens.corpus.atomic import atomic_writer
from mens.corpus.jsonrow import LongLine, check_file_size, decode_line, iter_lines, parse_row
from mens.corpus.records import BadLine
from mens.errors import DataError, UsageError


def read_objects(path: str | Path) -> Iterator[tuple[int, dict | BadLine]]:
    """Yield `(line_no, dict | BadLine)` for each non-blank line; never raises on content (DataError on size)."""
    path = Path(path)
    for no, raw in iter_lines(path):
        if isinstance(raw, LongLine):
            yield no, BadLine(str(path), no, raw.reason, raw.head.decode("utf-8", "replace"))
            continue
        text = decode_line(raw)
        if isinstance(text, tuple):
            yield no, BadLine(str(path), no, text[0], text[1].rstrip("\n"))
            continue
        obj = parse_row(text)
        if isinstance(obj, str):
            yield no, BadLine(str(path), no, obj, text.rstrip("\n"))
            continue
        yield no, obj


def reason_code(reason: str) -> str:
    """The short reason key of a BadLine/reject reason (`malformed_json: …` -> `malformed_json`)."""
    return reason.split(":", 1)[0]


def require_input(path: str | Path, stage: str) -> Path:
    """`path` as a Path; UsageError if missing, DataError if too large or it holds no non-blank line."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{path}: no such file; `mens corpus {stage}` needs an existing JSONL input")
    check_file_size(path)
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            if block.strip():
                return path
    raise DataError(f"{path}: file is empty (0 records, expected at least 1); "
                    f"run the previous stage again or point `mens corpus {stage}` at another file")


def dumps(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def jsonl_line(row: dict) -> bytes:
    """One JSONL line as UTF-8. Text that UTF-8 cannot hold (a lone surrogate) is kept as its JSON escape,
    so it is written losslessly and the next reader rejects that row with a reason."""
    text = dumps(row) + "\n"
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return (json.dumps(row, separators=(",", ":")) + "\n").encode("ascii")


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> int:
    """Write rows (one compact JSON object a line) atomically: temp file, fsync, rename; returns the count."""
    n = 0
    with atomic_writer(path, binary=True) as f:
        for row in rows:
            f.write(jsonl_line(row))
            n += 1
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
