"""Viable-prefix check for constrained decoding: can `text` still grow into Vox that parses?

Errors are positional, so a prefix is viable when it parses, or when its first error sits at end of input
(an open block, call or string), possibly after the last token is cut back to a shorter spelling.
"""

from __future__ import annotations

from mens.lang.vox.lexer import lex
from mens.lang.vox.parser import Parser

# Last characters of tokens that a longer token can start with (`-` of `->`, `<` of `<=`, `.` of `@mcp.tool`).
_EXTENDABLE_ENDS = frozenset("_-=|</>!+*@.")


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
        extendable = text[-1].isalnum() or text[-1] in _EXTENDABLE_ENDS
        if extendable and len(toks) >= 2 and toks.offsets[-2] < len(text):
            cut = text[: toks.offsets[-2]]
            if _error_at_end(cut, reactive_module):
                return True
        # Text after the last token (a dropped `@`, `!`, ...) may start a decorator or `!=`.
        tail = len(text) if len(toks) < 2 else toks.offsets[-2] + 1
        if tail < len(text) and _error_at_end(text[: len(text) - 1], reactive_module):
            return True
    return False
