"""Types and parameter lists: `NAME[T, ...]`, `_`, `dec`, numeric dims and `fn(T) to R`."""

from __future__ import annotations

from mens.lang.vox import tokens as T
from mens.lang.vox.core import Fail, ParserCore


class TypeRules(ParserCore):
    def parse_params(self) -> list[str]:
        names: list[str] = []
        if self.k[self.pos] == ")":
            return names
        while True:
            names.append(self.parse_ident_name())
            if self.eat(":"):
                self.parse_type_expr()
            if self.eat("="):
                self.parse_expr()  # type: ignore[attr-defined]
            if not self.eat(","):
                return names

    def parse_type_expr(self) -> None:
        kind = self.k[self.pos]
        if kind == "_" or kind == "dec" or kind == T.INT:
            self.advance()
            return
        if kind == "fn":
            self.advance()
            self.expect("(")
            self.enter()
            try:
                if self.k[self.pos] != ")":
                    while True:
                        self.parse_type_expr()
                        if not self.eat(","):
                            break
                self.expect(")")
                if self.eat_return_arrow():
                    self.parse_type_expr()
            finally:
                self.depth -= 1
            return
        self.parse_ident_name()
        if self.eat("["):
            self.enter()
            try:
                while True:
                    self.parse_type_expr()
                    if not self.eat(","):
                        break
                self.expect("]")
            finally:
                self.depth -= 1


__all__ = ["Fail", "TypeRules"]
