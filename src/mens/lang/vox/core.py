"""Parser state shared by all grammar mixins: cursor, expect/eat, diagnostics and the nesting guard.

Errors follow upstream: a failed rule pushes a diagnostic and raises `Fail`, which plays the role of
Rust's `Err(())` + `?`; callers that recover catch it.
"""

from __future__ import annotations

from mens.lang.base import Diagnostic
from mens.lang.vox import tokens as T
from mens.lang.vox.lexer import Tokens

# Python frames per nesting level are several, so the guard is far below upstream's 4096; no real
# source comes close to it.
MAX_DEPTH = 120


class Fail(Exception):
    """A rule failed after recording its diagnostic."""


class ParserCore:
    def __init__(self, toks: Tokens, reactive_module: bool = False) -> None:
        self.toks = toks
        self.k = toks.kinds
        self.v = toks.values
        self.last = len(self.k) - 1
        self.pos = 0
        self.diags: list[Diagnostic] = []
        self.has_error = False
        self.depth = 0
        self.first_error_pos: int | None = None
        self.reactive_module = reactive_module

    # -- cursor ---------------------------------------------------------------------------------
    def peek(self) -> str:
        return self.k[self.pos]

    def peek_at(self, i: int) -> str:
        return self.k[i] if i <= self.last else T.EOF

    def value(self) -> object:
        return self.v[self.pos]

    def advance(self) -> None:
        if self.pos < self.last:
            self.pos += 1

    def eat(self, kind: str) -> bool:
        if self.k[self.pos] == kind:
            if self.pos < self.last:
                self.pos += 1
            return True
        return False

    def expect(self, kind: str) -> None:
        if self.k[self.pos] == kind:
            if self.pos < self.last:
                self.pos += 1
            return
        self.error(f"Expected {kind}, found {self.found()}", "ExpectToken")
        raise Fail

    def skip_newlines(self) -> None:
        k = self.k
        while k[self.pos] == T.NEWLINE:
            self.pos += 1

    def found(self) -> str:
        return T.display(self.k[self.pos], self.v[self.pos])

    def is_ident(self, word: str) -> bool:
        return self.k[self.pos] == T.IDENT and self.v[self.pos] == word

    # -- diagnostics ----------------------------------------------------------------------------
    def error(self, message: str, cls: str, pos: int | None = None) -> None:
        at = self.pos if pos is None else pos
        self._push("error", message, cls, at)
        if self.first_error_pos is None:
            self.first_error_pos = at
        self.has_error = True

    def warning(self, message: str, cls: str) -> None:
        self._push("warning", message, cls, self.pos)

    def _push(self, severity: str, message: str, cls: str, pos: int) -> None:
        toks = self.toks
        self.diags.append(Diagnostic(severity, toks.lines[pos], toks.col(pos), message, cls))

    def fail(self, message: str, cls: str = "Declaration") -> Fail:
        self.error(message, cls)
        return Fail()

    def enter(self) -> None:
        """Nesting guard: deep input becomes a diagnostic instead of a RecursionError."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            self.depth -= 1
            self.error(f"Nesting deeper than {MAX_DEPTH} levels", "Expression")
            raise Fail

    # -- shared small rules -----------------------------------------------------------------------
    def parse_ident_name(self) -> str:
        kind = self.k[self.pos]
        if kind == T.IDENT or kind == T.TYPE_IDENT:
            name = self.v[self.pos]
            self.advance()
            return name  # type: ignore[return-value]
        if kind in T.NAME_KEYWORDS:
            self.advance()
            return kind
        self.error("Expected identifier", "Declaration")
        raise Fail

    def eat_return_arrow(self) -> bool:
        if self.eat("->"):
            self.warning("The '->' syntax is deprecated for return types. Use 'to'.", "Expression")
            return True
        return self.eat("to")
