"""Comment- and whitespace-insensitive forms of code, for near-duplicate detection and fence stripping.

Run: `normalize_code("fn f() {  // x\n}", "//") == "fn f() { }"`.
"""

from __future__ import annotations

import re

_FENCED = re.compile(r"```(?P<tag>[\w.+-]*)[^\n]*\n(?P<body>.*?)```", re.S)


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
    for m in _FENCED.finditer(text):
        if m["tag"].lower() in tags or not m["tag"]:
            return m["body"]
    return text
