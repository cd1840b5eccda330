"""Viable-prefix check for constrained decoding: can `text` still grow into Vox that parses?

Errors are positional, so a prefix is viable when it parses, or when its first error sits at end of input
(an open block, call or string), possibly after the last token is cut back to a shorter spelling.
"""

from __future__ import annotations

import re

from mens.lang.vox.lexer import comment_offsets, lex, sloppy_offsets
from mens.lang.vox.parser import Parser
from mens.lang.vox.tokens import DECORATORS, KEYWORDS, PUNCTUATION

# Words the parser checks by spelling where they matter (they lex as plain identifiers).
_CONTEXTUAL = (
    "routes url state_machine partial terminal from any uses key depends_on as rust react style raw_css not_found "
    "error field on_submit success_redirect error_message required optional hidden label range max_len min_len "
    "pattern default kind fallback provider secret origins by class tier model query mutation server version path "
    "git rev branch loader pending color light dark spacing radius shadow font family"
).split()
# `//` starts a comment: a trailing `/` may be its first half.
_SPELLINGS = tuple(sorted(KEYWORDS | set(DECORATORS) | set(PUNCTUATION) | set(_CONTEXTUAL) | {"//"}))


def _growths(word: str) -> list[str]:
    """Spellings the parser treats specially that `word` is a proper prefix of (`t` of `to`, `-` of `->`).

    A rejected number or ordinary name can never become acceptable by growing, so it has none.
    """
    return [s for s in _SPELLINGS if len(s) > len(word) and s.startswith(word)]


def _first_error(text: str, reactive_module: bool) -> tuple[int, str] | None:
    """(token index, message) of the first error and the EOF index, or None when `text` parses."""
    parser = Parser(lex(text), reactive_module=reactive_module)
    parser.parse_module()
    if parser.first_error_pos is None:
        return None
    first = next(d for d in parser.diags if d.severity == "error")
    return parser.first_error_pos - parser.last, first.message


# Continuations that move or fix an error caused only by the input ending early. An error that stays the
# same whatever follows (`@endpoint(kind: )`, reported at the end after `)` was consumed) is not such an error.
_PROBES = (" x", " |", " (", " {", " 0", ' "s"', "\n}", ")", " =", ":")


def _error_at_end(text: str, reactive_module: bool) -> bool | None:
    """True: parses, or fails only because it ended; False: fails earlier; None: the parser itself broke."""
    try:
        err = _first_error(text, reactive_module)
        if err is None:
            return True
        if err[0] != 0:  # not at EOF
            return False
        for probe in _PROBES:
            after = _first_error(text + probe, reactive_module)
            # Fixed, changed, or again stuck at the (later) end: the probe was taken, so the end was the problem.
            if after is None or after[1] != err[1] or after[0] == 0:
                return True
        return False
    except Exception:  # noqa: BLE001 - never raise from the decoding hot path
        return None


_STRINGS_AND_COMMENTS = re.compile(r'''//[^\n]*|#[^\n]*|"(?:[^"\\]|\\[^\n])*"|'(?:[^'\\]|\\[^\n])*'|["']''')


def _open_quote(text: str) -> str | None:
    """The quote of a string literal left open at the end of `text` (the lexer would drop it), or None."""
    last = None
    for m in _STRINGS_AND_COMMENTS.finditer(text):
        last = m.group()
    return last if last in ('"', "'") else None


def _in_comment(text: str) -> bool:
    """True when `text` ends inside a line comment: a `(` appended there adds no token."""
    return len(lex(text + "(")) == len(lex(text))


def viable_prefix(text: str, reactive_module: bool = False) -> bool:
    quote = _open_quote(text)
    if quote:  # an open string swallows what follows until it closes: judge the text with the string closed
        return _error_at_end(text + quote, reactive_module) or False
    if text and _in_comment(text):  # whatever comes next starts after the comment's newline
        return viable_prefix(text + "\n", reactive_module)
    if _error_at_end(text, reactive_module):
        return True
    # The last token may be an unfinished longer token (`-` of `->`, `@te` of `@test`, a half keyword).
    if text and not text[-1].isspace():
        toks = lex(text)
        start = toks.offsets[-2] if len(toks) >= 2 else len(text)
        if start > 0 and text[start - 1] == "@":  # `@sear`: a dropped `@` plus the start of a decorator name
            start -= 1
        # Only growths that the parser would accept right here count: `gi` could become `git`, but not at top level.
        # A grown `//` opens a comment, after which only a new line can continue.
        if start < len(text) and any(_error_at_end(text[:start] + (grown if grown != "//" else "//\n"), reactive_module)
                                     for grown in _growths(text[start:])):
            return True
        # A final `@` or `!` lexes as a dropped character, but may be the start of a decorator or of `!=`.
        if text[-1] in "@!" and _error_at_end(text[:-1], reactive_module):
            return True
    return False


_PARTIAL_AT = re.compile(r"@[A-Za-z_.]*")


def clean_viable_prefix(text: str, reactive_module: bool = False) -> bool:
    """A viable prefix with nothing the lexer would drop (`&&`, `;`, backticks, comments), so constrained
    answers are clean Vox; a final `@` or `!` may still become a decorator or `!=`.

    Comments are refused too: they never make code parse, and a model can loop on them until the token budget
    is spent (measured: `@scheduled // Run every hour` then sixty `// No cleanup()` lines, which no repair
    can close); refused, it has to continue the code.
    """
    if comment_offsets(text):
        return False
    for i in sloppy_offsets(text):
        unfinished = (text[i] == "!" and i == len(text) - 1) or (text[i] == "@" and _PARTIAL_AT.fullmatch(text, i))
        if not unfinished:
            return False
    return viable_prefix(text, reactive_module)
