"""Data and logic declarations: type (struct/ADT), @table, @index, url, state_machine, workflow, activity, actor."""

from __future__ import annotations

from mens.lang.vox import tokens as T
from mens.lang.vox.core import Fail
from mens.lang.vox.parse_fn import FnRules


class DataDeclRules(FnRules):
    def parse_typedef(self) -> tuple[str, str]:
        self.advance()  # type
        name = self.parse_ident_name()
        if self.eat("{"):
            n = self._struct_fields()
            return ("type_struct" if n else "type_adt", name)
        self.expect("=")
        self.skip_newlines()
        k = self.k
        while True:
            self.skip_newlines()
            if not self.eat("|"):
                break
            self.parse_ident_name()
            if self.eat("("):
                while k[self.pos] != ")":
                    self.parse_ident_name()
                    self.expect(":")
                    self.parse_type_expr()
                    if not self.eat(","):
                        break
                self.expect(")")
        return ("type_adt", name)

    def _struct_fields(self) -> int:
        """Fields up to and including `}`; newlines and/or commas separate them."""
        k = self.k
        n = 0
        while True:
            self.skip_newlines()
            if self.eat("}"):
                return n
            if k[self.pos] == T.EOF:
                self.expect("}")
            self.parse_ident_name()
            self.expect(":")
            self.parse_type_expr()
            n += 1
            self.eat(",")

    def parse_table(self) -> tuple[str, str]:
        self.advance()  # @table
        self.expect("type")
        name = self.parse_ident_name()
        self.expect("{")
        self._struct_fields()
        return ("table", name)

    def parse_index(self) -> tuple[str, str]:
        self.advance()  # @index
        table = self.parse_ident_name()
        self.expect(".")
        index = self.parse_ident_name()
        self.expect("on")
        self.expect("(")
        while self.k[self.pos] != ")":
            self.parse_ident_name()
            if not self.eat(","):
                break
        self.expect(")")
        return ("index", f"{table}.{index}")

    def parse_url_decl(self) -> tuple[str, str]:
        self.advance()  # url
        name = self.parse_ident_name()
        self.expect("{")
        k = self.k
        while True:
            self.skip_newlines()
            if self.eat("}"):
                break
            if k[self.pos] == T.EOF:
                raise self.fail("Unexpected EOF inside `url` block")
            self.parse_ident_name()
            if self.eat("("):
                while True:
                    self.skip_newlines()
                    if k[self.pos] == ")":
                        break
                    self.eat("?")
                    self.parse_ident_name()
                    self.expect(":")
                    self.parse_type_expr()
                    if not self.eat(","):
                        break
                self.expect(")")
            self.eat(",")
        return ("url", name)

    def parse_state_machine_decl(self) -> tuple[str, str]:
        self.advance()  # state_machine
        name = self.parse_ident_name()
        self.expect("{")
        k = self.k
        while True:
            self.skip_newlines()
            kind = k[self.pos]
            if kind == "}" or kind == T.EOF:
                break
            if kind == "state":
                self._sm_state()
            elif self.is_ident("terminal"):
                self.advance()
                if k[self.pos] != "state":
                    raise self.fail("Expected `state` after `terminal`")
                self._sm_state()
            elif kind == "on":
                self._sm_transition()
            else:
                raise self.fail("Expected `state`, `terminal state`, or `on` inside state_machine block; "
                                f"got {self.found()}")
            self.eat(",")
        self.expect("}")
        return ("state_machine", name)

    def _sm_state(self) -> None:
        self.advance()  # state
        self.parse_ident_name()
        if self.eat("("):
            k = self.k
            while True:
                self.skip_newlines()
                if k[self.pos] == ")" or k[self.pos] == T.EOF:
                    break
                self.parse_ident_name()
                if self.eat(":"):
                    self.parse_type_expr()
                if not self.eat(","):
                    break
            self.expect(")")

    def _sm_transition(self) -> None:
        self.advance()  # on
        self.parse_ident_name()
        k = self.k
        if self.eat("("):
            while True:
                self.skip_newlines()
                if k[self.pos] == ")" or k[self.pos] == T.EOF:
                    break
                self.parse_ident_name()
                if not self.eat(","):
                    break
            self.expect(")")
        if not self.is_ident("from"):
            raise self.fail("Expected `from` after event in transition")
        self.advance()
        if self.is_ident("any"):
            self.advance()
        else:
            self.parse_ident_name()
            if self.eat("("):
                self._skip_balanced_parens()
        self.expect("->")
        self.parse_ident_name()
        if self.eat("("):
            self._skip_balanced_parens()

    def _skip_balanced_parens(self) -> None:
        k = self.k
        depth = 1
        while k[self.pos] != T.EOF:
            kind = k[self.pos]
            self.advance()
            if kind == "(":
                depth += 1
            elif kind == ")":
                depth -= 1
                if depth == 0:
                    return

    def parse_workflow_like(self, kind: str) -> tuple[str, str]:
        """`workflow`/`activity NAME(params) [to T] { body }`."""
        self.advance()
        name = self.parse_ident_name()
        self.expect("(")
        self.parse_params()
        self.expect(")")
        if self.eat_return_arrow():
            self.parse_type_expr()
        self.expect("{")
        self.parse_block()
        return (kind, name)

    def parse_distributed_train(self) -> tuple[str, str]:
        self.advance()  # @distributed_train
        self.expect("(")
        k = self.k
        while True:
            self.skip_newlines()
            if k[self.pos] == ")" or k[self.pos] == T.EOF:
                break
            self.parse_ident_name()
            self.expect("=")
            self.advance()
            self.eat(",")
        self.expect(")")
        self.skip_newlines()
        if k[self.pos] != "workflow":
            self.expect("workflow")
        return self.parse_workflow_like("workflow")

    def parse_actor(self) -> tuple[str, str]:
        self.advance()  # actor
        name = self.parse_ident_name()
        self.expect("{")
        k = self.k
        while True:
            self.skip_newlines()
            if k[self.pos] == "}" or k[self.pos] == T.EOF:
                break
            if k[self.pos] != "on":
                raise self.fail("Expected `on` handler inside actor block")
            self.advance()
            self.parse_ident_name()
            self.expect("(")
            self.parse_params()
            self.expect(")")
            if self.eat_return_arrow():
                self.parse_type_expr()
            self.expect("{")
            self.parse_block()
        self.expect("}")
        return ("actor", name)


__all__ = ["DataDeclRules", "Fail"]
