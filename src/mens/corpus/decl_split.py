"""Split a source text into its top-level declarations, each with its own line span and leading comment.

Works for brace-delimited languages whose declarations start in column 0: cut at column-0 lines outside
braces, then merge neighbouring pieces until each parses on its own. The split is accepted only when the
pieces' declarations, in order, equal the whole text's, so a wrong cut is never emitted.
Run: used by `mens corpus extract`.
"""

from __future__ import annotations

from dataclasses import dataclass

from mens.corpus.normalize import code_spans
from mens.lang import Language

SPLIT_PARSE_BUDGET = 4
"""Splitting may parse at most this many times the text's length (plus 64 KB) before it gives up."""


@dataclass
class DeclSlice:
    """One top-level declaration: its parsed (kind, name) list, 1-based line span, code and leading comment."""

    decls: list[tuple[str, str]]
    start_line: int
    end_line: int
    code: str
    comment: str
    signature: str


def _depth_after(line: str, depth: int, comment: str) -> int:
    """Brace depth after `line`, ignoring braces inside string literals and after a line comment."""
    for i in code_spans(line, comment)[0]:
        if line[i] in "{([":
            depth += 1
        elif line[i] in "})]":
            depth = max(0, depth - 1)
    return depth


def _segments(lines: list[str], comment: str) -> list[tuple[int, int]]:
    """0-based [start, end) ranges of code starting at a column-0 line at depth 0 (comments/blank excluded)."""
    starts, depth = [], 0
    for i, line in enumerate(lines):
        s = line.strip()
        if depth == 0 and s and line[0] not in " \t})]" and not s.startswith(comment):
            starts.append(i)
        depth = _depth_after(line, depth, comment)
    ranges = []
    for k, start in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(lines)
        while end > start + 1 and (not lines[end - 1].strip() or lines[end - 1].lstrip().startswith(comment)):
            end -= 1  # trailing blank lines and the next declaration's leading comments do not belong here
        ranges.append((start, end))
    return ranges


def _leading_comment(lines: list[str], start: int, comment: str) -> str:
    """The comment lines directly above line `start` (no blank line between), without their markers.

    Stops at header comments (frontmatter, `@training_prompt`, ANCHOR markers): they describe the file.
    """
    out = []
    i = start - 1
    while i >= 0 and lines[i].lstrip().startswith(comment):
        text = lines[i].strip()[len(comment):].strip()
        if text == "---" or text.startswith(("@training_prompt", "ANCHOR")):
            break
        out.append(text)
        i -= 1
    out.reverse()
    return " ".join(t for t in out if t)


def _signature(code: str, comment: str) -> str:
    """The declaration's header line (after decorator lines), without its opening brace."""
    lines = [ln.strip() for ln in code.splitlines() if ln.strip() and not ln.strip().startswith(comment)]
    head = next((ln for ln in lines if not ln.startswith("@") or " fn " in ln or " type " in ln), lines[0])
    if head.startswith("@") and " fn " in head:  # `@endpoint(kind: query) fn f()`: the decorator is the kind
        head = head[head.index(" fn ") + 1 :]
    return head[:-1].strip() if head.endswith("{") else head


def split_decls(lang: Language, text: str, comment: str = "//") -> list[DeclSlice] | None:
    """The top-level declarations of `text` as slices, or None when `text` does not parse or cannot be split."""
    whole = lang.parse(text)
    if not whole.ok or not whole.decls:
        return None
    lines = text.splitlines()
    slices: list[DeclSlice] = []
    pending: tuple[int, int] | None = None
    # Merging re-parses a growing prefix; text whose column-0 lines sit inside a string literal would make that
    # quadratic, so the parse work is capped at a few times the text and the split is abandoned beyond it.
    budget = SPLIT_PARSE_BUDGET * len(text) + 65_536
    for start, end in _segments(lines, comment):
        lo = pending[0] if pending else start
        code = "\n".join(lines[lo:end]) + "\n"
        budget -= len(code)
        if budget < 0:
            return None
        res = lang.parse(code)
        if res.ok and res.decls:
            slices.append(DeclSlice(list(res.decls), lo + 1, end, code, _leading_comment(lines, lo, comment),
                                    _signature(code, comment)))
            pending = None
        else:
            pending = (lo, end)
    got = [d for s in slices for d in s.decls]
    if pending is not None or got != list(whole.decls):
        return None
    return slices
