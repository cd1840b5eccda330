"""Viable-prefix check for constrained decoding: can `text` still grow into Vox that parses?

Errors are positional, so a prefix is viable when it parses, or when its first error sits at end of input
(an open block, call or string), possibly after the last token is cut back to a shorter spelling.
"""

from __future__ import annotations

from mens.lang.vox.lexer import lex
from mens.lang.vox.parser import Parser
from mens.lang.vox.tokens import DECORATORS, KEYWORDS, PUNCTUATION

# Words the parser checks by spelling where they matter (they lex as plain identifiers).
_CONTEXTUAL = (
    "routes url state_machine partial terminal from any uses key depends_on as rust react style raw_css not_found "
    "error field on_submit success_redirect error_message required optional hidden label range max_len min_len "
    "pattern default kind fallback provider secret origins by class tier model query mutation server version path "
    "git rev branch loader pending color light dark spacing radius shadow font family"
).split()
_SPELLINGS = tuple(sorted(KEYWORDS | set(DECORATORS) | set(PUNCTUATION) | set(_CONTEXTUAL)))


def _could_grow(word: str) -> bool:
    """True when `word` is a proper prefix of a spelling the parser treats specially (`t` of `to`, `-` of `->`).

    A rejected number or ordinary name can never become acceptable by growing, so it is not viable.
    """
    return any(len(s) > len(word) and s.startswith(word) for s in _SPELLINGS)


def _error_at_end(text: str, reactive_module: bool) -> bool | None:
    """True: parses or fails only at EOF; False: fails earlier; None: the parser itself broke."""
    try:
        parser = Parser(lex(text), reactive_module=reactive_module)
        parser.parse_module()
    except Exception:  # noqa: BLE001 - never raise from the decoding hot path
        return None
    return parser.first_error_pos is None or parser.first_error_pos == parser.last


def viable_prefix(text: str, reactive_module: bool = False) -> bool:
    if _error_at_end(text, reactive_module):
        return True
    # An unterminated string is dropped by the lexer; closing it shows whether the code around it is fine.
    for quote in ('"', "'"):
        if quote in text and _error_at_end(text + quote, reactive_module):
            return True
    # The last token may be an unfinished longer token (`-` of `->`, `@te` of `@test`, a half keyword).
    if text and not text[-1].isspace():
        toks = lex(text)
        start = toks.offsets[-2] if len(toks) >= 2 else len(text)
        if start > 0 and text[start - 1] == "@":  # `@sear`: a dropped `@` plus the start of a decorator name
            start -= 1
        if start < len(text) and _could_grow(text[start:]):
            cut = text[: toks.offsets[-2]]
            if _error_at_end(cut, reactive_module):
                return True
        # Text after the last token (a dropped `@`, `!`, ...) may start a decorator or `!=`.
        tail = len(text) if len(toks) < 2 else toks.offsets[-2] + 1
        if tail < len(text) and _error_at_end(text[: len(text) - 1], reactive_module):
            return True
    return False
