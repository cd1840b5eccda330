"""Statements, blocks and patterns. Blocks need no separators; a failed statement skips to the next line."""

from __future__ import annotations

from mens.lang.vox import tokens as T
from mens.lang.vox.core import Fail
from mens.lang.vox.parse_types import TypeRules

_ASSIGN_OPS = frozenset(("+=", "-=", "*=", "/="))


class StmtRules(TypeRules):
    def parse_block(self) -> None:
        """Statements up to and including the closing `}` (the `{` is already consumed)."""
        self.enter()
        try:
            k = self.k
            while True:
                self.skip_newlines()
                kind = k[self.pos]
                if kind == "}" or kind == T.EOF:
                    break
                try:
                    self.parse_stmt()
                except Fail:
                    while k[self.pos] not in (T.NEWLINE, "}", T.EOF):
                        self.advance()
            self.expect("}")
        finally:
            self.depth -= 1

    def parse_stmt(self) -> None:
        kind = self.k[self.pos]
        if kind == "let":
            self.advance()
            self.eat("mut")
            self.parse_pattern()
            if self.eat(":"):
                self.parse_type_expr()
            self.expect("=")
            self.parse_expr()
        elif kind == "return":
            self.advance()
            if self.k[self.pos] not in (T.NEWLINE, "}", T.EOF):
                self.parse_expr()
        elif kind == "while":
            self.advance()
            self.parse_expr()
            self.expect("{")
            self.parse_block()
        elif kind == "loop":
            self.advance()
            self.expect("{")
            self.parse_block()
        elif kind == "break" or kind == "continue":
            self.advance()
        else:
            self.parse_expr()
            if self.eat("=") or (self.k[self.pos] in _ASSIGN_OPS and self.eat(self.k[self.pos])):
                self.parse_expr()

    def parse_pattern(self) -> None:
        kind = self.k[self.pos]
        if kind == "_" or kind == T.IDENT or kind == T.INT or kind == T.STR:
            self.advance()
            return
        if kind == "(" or kind == T.TYPE_IDENT:
            self.advance()
            if kind == T.TYPE_IDENT and not self.eat("("):
                return
            self.enter()
            try:
                while self.k[self.pos] != ")":
                    self.parse_pattern()
                    if not self.eat(","):
                        break
                self.expect(")")
            finally:
                self.depth -= 1
            return
        self.error("Expected pattern", "Statement")
        raise Fail
