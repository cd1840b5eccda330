"""UI declarations: component (+ style blocks), fragment, `.vox.ui` reactive modules, @v0, routes, @form,
and the mobile blocks @back_button, @deep_link, @push, @tokens."""

from __future__ import annotations

from mens.lang.vox import tokens as T
from mens.lang.vox.core import Fail
from mens.lang.vox.parse_decl_data import DataDeclRules

REACTIVE_MEMBERS = frozenset(("state", "derived", "effect", "on"))


class UiDeclRules(DataDeclRules):
    def parse_component(self) -> tuple[str, str]:
        self.advance()  # component
        name = self.parse_ident_name()
        self.expect("(")
        self.parse_params()
        self.expect(")")
        self.expect("{")
        k = self.k
        while True:
            self.skip_newlines()
            kind = k[self.pos]
            if kind == "}" or kind == T.EOF:
                break
            if kind in REACTIVE_MEMBERS:
                self._reactive_member("reactive component block")
            elif kind == "view":
                self.advance()
                self.expect(":")
                self.parse_expr()
            else:
                self.parse_stmt()
        self.expect("}")
        self.parse_style_blocks()
        return ("component", name)

    def _reactive_member(self, where: str) -> None:
        kind = self.k[self.pos]
        if kind == "state" or kind == "derived":
            self.advance()
            self.parse_ident_name()
            if self.eat(":"):
                self.parse_type_expr()
            self.expect("=")
            self.parse_expr()
        elif kind == "effect":
            self.advance()
            if self.is_ident("depends_on"):
                self.advance()
                self.expect("(")
                while self.k[self.pos] not in (")", T.EOF):
                    self.parse_ident_name()
                    if not self.eat(","):
                        break
                self.expect(")")
            self._colon_body()
        else:  # on
            self.advance()
            if self.k[self.pos] in ("mount", "cleanup"):
                self.advance()
                self._colon_body()
            else:
                raise self.fail(f"Expected `mount` or `cleanup` after `on` in {where}.")

    def _colon_body(self) -> None:
        self.expect(":")
        if self.eat("{"):
            self.parse_block()
        else:
            self.parse_expr()

    def parse_style_blocks(self) -> None:
        """Optional `style { .sel { prop: "v" } }` / `raw_css { ... }` blocks right after a component.

        As lenient as upstream (`expr/style.rs`): only a missing class name is an error; anything else that is
        not a rule or a `prop: "value"` pair ends the block or rule quietly (its closing brace is optional), and
        parsing goes on from there. So a rule written inside a rule is read as the next rule, and the outer
        rule's `}` closes the block.
        """
        k = self.k
        self.skip_newlines()
        while k[self.pos] == T.IDENT and self.v[self.pos] in ("style", "raw_css"):
            self.advance()
            if not self.eat("{"):
                break
            while True:
                self.skip_newlines()
                if k[self.pos] != ".":
                    break
                self.advance()
                try:
                    self.parse_ident_name()
                except Fail:
                    break
                if not self.eat("{"):
                    break
                while True:
                    self.skip_newlines()
                    if k[self.pos] != T.IDENT:
                        break
                    self.advance()
                    if not self.eat(":") or k[self.pos] != T.STR:
                        break
                    self.advance()
                self.eat("}")  # closes the rule
            self.eat("}")  # closes the block

    def parse_fragment(self) -> tuple[str, str]:
        self.advance()  # fragment
        name = self.parse_ident_name()
        self.expect("(")
        self.parse_params()
        self.expect(")")
        self.expect("{")
        self.skip_newlines()
        self.parse_expr()
        self.skip_newlines()
        self.expect("}")
        return ("fragment", name)

    def parse_reactive_module(self) -> tuple[str, str]:
        while True:
            self.skip_newlines()
            if self.k[self.pos] not in REACTIVE_MEMBERS:
                return ("reactive_module", "")
            self._reactive_member("at module scope in a `.vox.ui` file")

    def parse_v0(self) -> tuple[str, str]:
        self.advance()  # @v0
        if self.is_ident("from"):
            self.advance()
            if not self.eat(T.STR):
                raise self.fail("Expected image path string after `@v0 from`")
        elif not self.eat(T.STR):
            raise self.fail("Expected v0 chat id string or `from \"path\"` after @v0")
        name = self.parse_ident_name()
        self.expect("{")
        k = self.k
        while True:
            self.skip_newlines()
            if k[self.pos] == "}" or k[self.pos] == T.EOF:
                break
            self.parse_ident_name()
            self.eat("?")
            self.expect(":")
            self.parse_type_expr()
        self.eat("}")
        return ("v0_component", name)

    def parse_routes(self) -> tuple[str, str]:
        self.advance()  # routes
        self.expect("{")
        n = 0
        k = self.k
        while True:
            self.skip_newlines()
            if k[self.pos] == T.STR:
                self._route_entry()
                n += 1
            elif self.is_ident("not_found") or self.is_ident("error"):
                self.advance()
                self.expect(":")
                self.parse_ident_name()
            else:
                break
        self.eat("}")
        return ("routes", f"{n} entries")

    def _route_entry(self) -> None:
        self.advance()  # path string
        if self.k[self.pos] != "to":
            raise self.fail("In `routes { ... }`, each entry must place the keyword `to` between the path string "
                            "and the component name (for example: `\"/\" to Home`)")
        self.advance()
        self.parse_ident_name()
        if self.eat("with"):
            if self.eat("("):
                if self.k[self.pos] != ")":
                    while True:
                        self._route_with_item()
                        if self.eat(","):
                            if self.k[self.pos] == ")":
                                break
                            continue
                        break
                self.expect(")")
            else:
                self._route_with_item()
        if self.eat("{"):
            while True:
                self.skip_newlines()
                if self.eat("}"):
                    return
                if self.k[self.pos] != T.STR:
                    raise self.fail("In nested route `{ ... }` blocks, each entry must start with a string path")
                self._route_entry()

    def _route_with_item(self) -> None:
        key = self.parse_ident_name()
        self.expect(":")
        self.parse_ident_name()
        if key not in ("loader", "pending", "error"):
            raise self.fail("In `routes { ... }`, `with` only supports `loader:` and `pending:` keys")

    def parse_form(self) -> tuple[str, str]:
        self.advance()  # @form
        name = self.parse_ident_name()
        self.expect("{")
        k = self.k
        while True:
            self.skip_newlines()
            kind = k[self.pos]
            if kind == "}" or kind == T.EOF:
                break
            word = self.v[self.pos] if kind == T.IDENT else None
            if word == "field":
                self.advance()
                self._form_field()
            elif word == "on_submit":
                self.advance()
                self.expect(":")
                self.parse_ident_name()
            elif word in ("success_redirect", "error_message"):
                self.advance()
                self.expect(":")
                if not self.eat(T.STR):
                    raise self.fail(f"Expected string literal for {word}")
            else:
                raise self.fail(f"Unexpected token inside @form block: {self.found()}; expected `field`, "
                                "`on_submit`, `success_redirect`, or `}`")
        self.expect("}")
        return ("form", name)

    def _form_field(self) -> None:
        self.parse_ident_name()
        self.expect(":")
        self.parse_type_expr()
        k = self.k
        while True:
            kind = k[self.pos]
            if kind != T.IDENT:
                return
            word = self.v[self.pos]
            if word in ("required", "optional", "hidden"):
                self.advance()
            elif word in ("label", "pattern"):
                self.advance()
                self.expect("(")
                if not self.eat(T.STR):
                    raise self.fail(f"Expected string literal inside {word}(...)")
                self.expect(")")
            elif word == "range":
                self.advance()
                self.expect("(")
                if not self.eat(T.INT):
                    raise self.fail("Expected integer literal for range lower bound")
                self.expect(".")
                self.expect(".")
                if not self.eat(T.INT):
                    raise self.fail("Expected integer literal for range upper bound")
                self.expect(")")
            elif word in ("max_len", "min_len"):
                self.advance()
                self.expect("(")
                if not self.eat(T.INT):
                    raise self.fail(f"Expected integer literal inside {word}(...)")
                self.expect(")")
            elif word == "default":
                self.advance()
                self.expect("(")
                self.parse_expr()
                self.expect(")")
            else:
                return

    def parse_key_block(self, kind: str, string_values: bool) -> tuple[str, str]:
        """@back_button / @push (`key: name`) and @deep_link (`key: "str" | name`) blocks."""
        self.advance()
        self.expect("{")
        k = self.k
        while True:
            self.skip_newlines()
            if k[self.pos] == "}" or k[self.pos] == T.EOF:
                break
            if k[self.pos] != T.IDENT:
                raise self.fail(f"Expected field name inside @{kind} block, got `{self.found()}`")
            self.advance()
            self.expect(":")
            if string_values and self.eat(T.STR):
                pass
            elif string_values and k[self.pos] not in (T.IDENT, T.TYPE_IDENT):
                raise self.fail(f"Expected string or identifier as value in @{kind} block, got `{self.found()}`")
            else:
                self.parse_ident_name()
        self.expect("}")
        return (kind, "")

    def parse_tokens_block(self) -> tuple[str, str]:
        self.advance()  # @tokens
        self.expect("{")
        k = self.k
        while True:
            self.skip_newlines()
            if k[self.pos] == "}" or k[self.pos] == T.EOF:
                break
            word = self.v[self.pos] if k[self.pos] == T.IDENT else None
            if word == "color":
                self.advance()
                self.parse_ident_name()
                for key in ("light", "dark"):
                    self._expect_word(key)
                    self.expect(":")
                    self._token_string()
            elif word in ("spacing", "radius", "shadow"):
                self.advance()
                self.parse_ident_name()
                self.expect(":")
                self._token_string()
            elif word == "font":
                self.advance()
                self.parse_ident_name()
                self._expect_word("family")
                self.expect(":")
                self._token_string()
            else:
                raise self.fail(f"Unexpected token inside @tokens block: {self.found()}")
        self.expect("}")
        return ("tokens", "")

    def _expect_word(self, word: str) -> None:
        if not self.is_ident(word):
            raise self.fail(f"Expected `{word}` inside @tokens block, found {self.found()}")
        self.advance()

    def _token_string(self) -> None:
        if not (self.eat(T.STR) or self.eat(T.SSTR)):
            raise self.fail(f"Expected string value inside @tokens block, found {self.found()}")


__all__ = ["Fail", "UiDeclRules"]
