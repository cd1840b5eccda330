"""Comment- and whitespace-insensitive forms of code, for near-duplicate detection and fence stripping.

Run: `normalize_code("fn f() {  // x\n}", "//") == "fn f() { }"`.
"""

from __future__ import annotations

import re

_TAG = re.compile(r"[\w.+-]*")


def code_spans(line: str, comment: str = "//") -> tuple[list[int], int]:
    """Indices of the characters outside string literals, and where the line comment starts (len(line): none)."""
    code: list[int] = []
    i, quote = 0, ""
    while i < len(line):
        ch = line[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif line.startswith(comment, i):
            return code, i
        else:
            code.append(i)
        i += 1
    return code, len(line)


def strip_line_comment(line: str, comment: str = "//") -> str:
    """`line` without its trailing line comment; comment markers inside string literals are kept."""
    return line[: code_spans(line, comment)[1]]


def normalize_code(text: str, comment: str = "//") -> str:
    """Code with comments removed and every whitespace run collapsed to one space."""
    return " ".join(" ".join(strip_line_comment(ln, comment) for ln in text.splitlines()).split())


def code_in_response(text: str, tags: tuple[str, ...]) -> str:
    """The code of a response: the first fenced block tagged with one of `tags` (or untagged), else the text."""
    # Same matches as the regex ```(tag)[^\n]*\n(body)```, found with str.find so that a text of many
    # unclosed fences is scanned in linear time (the regex backtracked quadratically on it).
    pos = 0
    while (start := text.find("```", pos)) >= 0:
        tag = _TAG.match(text, start + 3).group()
        newline = text.find("\n", start + 3)
        if newline < 0:
            return text
        end = text.find("```", newline + 1)
        if end < 0:
            return text
        if tag.lower() in tags or not tag:
            return text[newline + 1 : end]
        pos = end + 3
    return text
