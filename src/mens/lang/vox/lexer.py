"""The Vox lexer: longest match over the token table; comments and unknown characters are dropped.

One compiled regex with named groups does the scanning; `lex` returns parallel lists for speed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mens.lang.vox import tokens as T

_I64_MAX = 2**63 - 1

_DECORATOR_RE = "|".join(re.escape(d[1:]) for d in sorted(T.DECORATORS, key=len, reverse=True))
_PUNCT_RE = "|".join(re.escape(p) for p in T.PUNCTUATION)
# Group order matters only where two groups can start at the same character; none of these can,
# except comments vs `/`, so comments come before punctuation.
_MASTER = re.compile(
    r"(?P<ws>[ \t]+)"
    r"|(?P<nl>\r?\n)"
    r"|(?P<com>(?://|\#)[^\n]*)"
    r"|(?P<word>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<num>[0-9]+(?:\.[0-9]+)?(?:dec)?)"
    r'|(?P<str>"(?:[^"\\]|\\.)*")'
    r"|(?P<sstr>'(?:[^'\\]|\\.)*')"
    rf"|(?P<deco>@(?:{_DECORATOR_RE}))"
    rf"|(?P<punct>{_PUNCT_RE})"
    r"|(?P<err>.)"
)

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0"}
_ESC_RE = re.compile(r"\\(.)")


def _unescape(body: str) -> str:
    if "\\" not in body:
        return body
    return _ESC_RE.sub(lambda m: _ESCAPES.get(m.group(1), m.group(0)), body)


@dataclass(slots=True)
class Tokens:
    """Parallel token arrays; the last entry is always EOF at `len(source)`."""

    kinds: list[str]
    values: list[object]
    offsets: list[int]
    lines: list[int]
    line_starts: list[int]

    def __len__(self) -> int:
        return len(self.kinds)

    def col(self, i: int) -> int:
        return self.offsets[i] - self.line_starts[self.lines[i] - 1] + 1


def lex(text: str) -> Tokens:
    """Tokenize `text` like upstream `lex()`: drops comments and unrecognised characters, appends EOF."""
    kinds: list[str] = []
    values: list[object] = []
    offsets: list[int] = []
    lines: list[int] = []
    line_starts = [0]
    line = 1
    keywords = T.KEYWORDS
    k_append, v_append, o_append, l_append = kinds.append, values.append, offsets.append, lines.append
    for m in _MASTER.finditer(text):
        group = m.lastgroup
        if group == "ws" or group == "com" or group == "err":
            continue
        s = m.group()
        start = m.start()
        if group == "word":
            if s in keywords:
                k_append(s)
                v_append(None)
            elif s == "_":
                k_append("_")
                v_append(None)
            else:
                k_append(T.TYPE_IDENT if "A" <= s[0] <= "Z" else T.IDENT)
                v_append(s)
        elif group == "punct" or group == "deco":
            k_append(s)
            v_append(None)
        elif group == "nl":
            k_append(T.NEWLINE)
            v_append(None)
            o_append(start)
            l_append(line)
            line += 1
            line_starts.append(m.end())
            continue
        elif group == "num":
            if s.endswith("dec"):
                k_append(T.DEC)
                v_append(s[:-3])
            elif "." in s:
                k_append(T.FLOAT)
                v_append(float(s))
            else:
                value = int(s)
                if value > _I64_MAX:  # upstream: an overflowing literal is an error lexeme, dropped
                    continue
                k_append(T.INT)
                v_append(value)
        else:  # str / sstr: strings may span lines, so keep the line count in step
            k_append(T.STR if group == "str" else T.SSTR)
            v_append(_unescape(s[1:-1]))
            o_append(start)
            l_append(line)
            n = s.count("\n")
            if n:
                pos = start
                for _ in range(n):
                    pos = text.index("\n", pos) + 1
                    line_starts.append(pos)
                line += n
            continue
        o_append(start)
        l_append(line)
    k_append(T.EOF)
    v_append(None)
    o_append(len(text))
    l_append(line)
    return Tokens(kinds, values, offsets, lines, line_starts)


def sloppy_offsets(text: str) -> list[int]:
    """Offsets of what the lexer silently drops (unknown characters) and of `#` comments.

    Upstream accepts both, so they never affect a verdict; constrained decoding avoids them so that
    the code it produces is clean, not merely accepted (`ret x` style leniency stays out of answers).
    """
    return [m.start() for m in _MASTER.finditer(text)
            if m.lastgroup == "err" or (m.lastgroup == "com" and m.group().startswith("#"))]


def comment_offsets(text: str) -> list[int]:
    """Offsets of every comment (`//` and `#`), strings excluded: the lexer drops them."""
    return [m.start() for m in _MASTER.finditer(text) if m.lastgroup == "com"]
