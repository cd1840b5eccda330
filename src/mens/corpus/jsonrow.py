"""Bounded JSONL reading: lines of at most MAX_LINE_BYTES, JSON of bounded depth, text that can be written back.

Every line is either a dict or a reason (`code: detail`) naming what is wrong and the limit it broke. No line
can exhaust memory (over-long lines are skipped in chunks), recurse without bound (nested JSON is caught and
measured iteratively) or kill a later write (lone surrogates and NUL characters are rejected here).
Run: used by `mens.corpus.jsonl.read_objects` and `mens.corpus.records.read_pairs`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mens.corpus.limits import MAX_JSON_DEPTH, MAX_JSONL_FILE_BYTES, MAX_LINE_BYTES, MAX_RAW_KEEP_BYTES
from mens.errors import DataError

_CHUNK = 1 << 20


@dataclass(frozen=True)
class LongLine:
    """A line over MAX_LINE_BYTES: its size, sha256 and at most MAX_RAW_KEEP_BYTES of its head."""

    size: int
    sha256: str
    head: bytes

    @property
    def reason(self) -> str:
        kept = "" if len(self.head) == self.size else f"; raw kept: first {len(self.head)} bytes"
        return (f"line_too_long: {self.size} bytes > {MAX_LINE_BYTES} allowed (the trainer's limit); "
                f"sha256 {self.sha256[:16]}{kept}")


def check_file_size(path: Path, limit: int | None = None, what: str = "JSONL input") -> None:
    """DataError when `path` is larger than `limit` (default MAX_JSONL_FILE_BYTES), checked before reading."""
    limit = MAX_JSONL_FILE_BYTES if limit is None else limit
    size = path.stat().st_size
    if size > limit:
        raise DataError(f"{path}: {what} is {size} bytes > {limit} allowed; split it into smaller files "
                        "(e.g. `split -l 100000`) and run each")


def _rest_of_line(f, first: bytes) -> LongLine:
    """Consume the rest of an over-long line in chunks, keeping only its head."""
    h, size, head = hashlib.sha256(first), len(first), bytearray(first)
    line = first
    while not line.endswith(b"\n"):
        line = f.readline(_CHUNK)
        if not line:
            break
        h.update(line)
        size += len(line)
        if len(head) < MAX_RAW_KEEP_BYTES:
            head += line[: MAX_RAW_KEEP_BYTES - len(head)]
    return LongLine(size, h.hexdigest(), bytes(head).rstrip(b"\n"))


def iter_lines(path: str | Path) -> Iterator[tuple[int, bytes | LongLine]]:
    """Yield `(line_no, raw bytes | LongLine)` for each non-blank line; memory bounded by MAX_RAW_KEEP_BYTES."""
    path = Path(path)
    check_file_size(path)
    with path.open("rb") as f:
        no = 0
        while True:
            raw = f.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            no += 1
            if len(raw) > MAX_LINE_BYTES:
                yield no, _rest_of_line(f, raw)
            elif raw.strip():
                yield no, raw


def shape_problem(obj: object, check_text: bool) -> str | None:
    """Why a parsed value cannot be kept (too deep, lone surrogate, NUL character), walked without recursion."""
    stack = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            if depth > MAX_JSON_DEPTH:
                return f"too_deep: JSON nests more than {MAX_JSON_DEPTH} levels"
            stack.extend((k, depth) for k in value)
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            if depth > MAX_JSON_DEPTH:
                return f"too_deep: JSON nests more than {MAX_JSON_DEPTH} levels"
            stack.extend((v, depth + 1) for v in value)
        elif check_text and isinstance(value, str):
            if "\x00" in value:
                return "nul_char: a string holds U+0000 (binary data, not text)"
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                return f"lone_surrogate: \\u{ord(value[e.start]):04x} at string offset {e.start} is not text " \
                       "(an unpaired UTF-16 surrogate escape)"
    return None


def parse_row(text: str) -> dict | str:
    """One decoded line as a dict, or a reason `code: detail`; never raises on content."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        return f"malformed_json: {e.msg} (col {e.colno})"
    except RecursionError:
        return f"too_deep: JSON nests more than {MAX_JSON_DEPTH} levels"
    if not isinstance(obj, dict):
        return f"not_object: expected a JSON object, got {type(obj).__name__}"
    # only escapes can make a lone surrogate or NUL (raw ones fail UTF-8 decoding or JSON); skip the text walk else
    problem = shape_problem(obj, check_text="\\u" in text or "\\U" in text)
    return problem or obj


def parse_json_value(text: str) -> tuple[object, str | None]:
    """(value, None) for any JSON of bounded depth whose strings encode, else (None, reason); for JSON in a field."""
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, TypeError) as e:
        return None, f"malformed_json: {e}"
    except RecursionError:
        return None, f"too_deep: JSON nests more than {MAX_JSON_DEPTH} levels"
    problem = shape_problem(obj, True)
    return (None, problem) if problem else (obj, None)


def decode_line(raw: bytes) -> str | tuple[str, str]:
    """UTF-8 text of a line, or (reason, replacement-decoded text)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return (f"not_utf8: invalid byte 0x{raw[e.start]:02x} at column {e.start + 1}",
                raw.decode("utf-8", "replace"))
