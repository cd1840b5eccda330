"""Vox token kinds and the fixed lexical tables (keywords, decorators, punctuation).

A token kind is a short interned string: literal tokens use their own spelling (`fn`, `(`, `@test`),
value-carrying tokens use the upper-case names below.
"""

from __future__ import annotations

IDENT = "IDENT"  # [a-z_][A-Za-z0-9_]*
TYPE_IDENT = "TYPE_IDENT"  # [A-Z][A-Za-z0-9_]*
INT = "INT"
FLOAT = "FLOAT"
DEC = "DEC"
STR = "STR"  # "..."
SSTR = "SSTR"  # '...'
NEWLINE = "NEWLINE"
EOF = "EOF"

KEYWORDS = frozenset(
    "fn let async mut if else while loop break continue match when fetching empty for in to return type dec "
    "import extern actor workflow activity side_effect spawn http pub with on state derived effect mount "
    "cleanup view component agent migrate env fragment and or not is isnt true false".split()
)

DECORATORS = tuple(
    "@component @tool @mcp.tool @resource @mcp.resource @test @endpoint @table @index @native @loading "
    "@require @ensure @invariant @forall @fuzz @pure @reactive @scheduled @deprecated @v0 @ai @prompt "
    "@subagent @search @hole @cancellable @form @back_button @deep_link @push @tokens @cors @rate_limit "
    "@uses @pii @embed @webhook @auth @offline_capable @collaborative @layer @remote @inference "
    "@training_step @distributed_train".split()
)

# Multi-character punctuation first so that a regex alternation picks the longest spelling.
PUNCTUATION = (
    "</>", "->", "=>", "|>", "==", "!=", "+=", "-=", "*=", "/=", "<=", ">=", "</", "/>", "<>",
    "(", ")", "[", "]", "{", "}", ":", "?", ",", ".", "=", "|", "<", ">", "+", "-", "*", "/", "%",
)

# Decorators that may precede `fn` inside parse_fn_decl (the "fn decorators").
FN_DECORATORS = frozenset(
    "@require @ensure @invariant @pure @reactive @remote @deprecated @fuzz @native @training_step @ai @prompt "
    "@subagent @search @hole @inference @uses @webhook @cors @rate_limit @pii @layer @embed @auth "
    "@offline_capable @collaborative".split()
)

# Words the parser accepts where a name is expected although they lex as keywords.
NAME_KEYWORDS = frozenset("type on state derived effect mount cleanup view component http env to in".split())

_DISPLAY = {NEWLINE: "<newline>", EOF: "<eof>"}


def display(kind: str, value: object) -> str:
    """How upstream prints a token in messages: its spelling, or its value for value tokens."""
    if value is not None:
        if kind == STR:
            return f'"{value}"'
        if kind == SSTR:
            return f"'{value}'"
        return str(value)
    return _DISPLAY.get(kind, kind)
