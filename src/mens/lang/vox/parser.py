"""Top level: declaration dispatch, imports, module / script / reactive-module loops and recovery."""

from __future__ import annotations

from mens.lang.vox import tokens as T
from mens.lang.vox.ast import Decl
from mens.lang.vox.core import Fail
from mens.lang.vox.parse_decl_ui import REACTIVE_MEMBERS, UiDeclRules

TOMBSTONED = frozenset(("http", "@component", "agent", "env"))
_FN_START = T.FN_DECORATORS | {"fn"}
# Script mode treats these as declarations; everything else at top level is a statement of `main`.
_SCRIPT_DECL_TOKENS = frozenset(
    "import component @component @loading @test @v0 @endpoint @forall @scheduled @tool @mcp.tool @resource "
    "@mcp.resource fn pub type actor agent env workflow activity http @table @index async".split()
)
_SCRIPT_DECL_WORDS = frozenset(("routes", "url", "state_machine"))
# Top-level recovery stops before these (when not inside braces).
_RECOVERY_STOP = frozenset(
    "fn @component import type actor workflow http @test @endpoint @table agent env component @forall @scheduled "
    "@require @ensure @invariant @fuzz @pure @ai @deprecated @loading let async".split()
)
_WRAPPERS = {"@loading": "loading", "@test": "test", "@forall": "forall", "@scheduled": "scheduled",
             "@tool": "mcp_tool", "@mcp.tool": "mcp_tool", "@resource": "mcp_resource",
             "@mcp.resource": "mcp_resource", "@endpoint": "endpoint"}


class Parser(UiDeclRules):
    def parse_module(self) -> list[Decl]:
        decls: list[Decl] = []
        k = self.k
        self.skip_newlines()
        while k[self.pos] != T.EOF:
            line = self.toks.lines[self.pos]
            try:
                kind, name = self.parse_decl()
                decls.append(Decl(kind, name, line))
            except Fail:
                self.recover_to_top_level()
            self.skip_newlines()
        return decls

    def parse_script(self) -> list[Decl]:
        decls: list[Decl] = []
        has_main = False
        k = self.k
        self.skip_newlines()
        while k[self.pos] != T.EOF:
            kind = k[self.pos]
            line = self.toks.lines[self.pos]
            if kind in TOMBSTONED:
                self._tombstone()
                self.recover_to_top_level()
            elif kind in _SCRIPT_DECL_TOKENS or (kind == T.IDENT and self.v[self.pos] in _SCRIPT_DECL_WORDS):
                try:
                    dkind, name = self.parse_decl()
                    decls.append(Decl(dkind, name, line))
                except Fail:
                    self.recover_to_top_level()
            else:
                try:
                    self.parse_stmt()
                    has_main = True
                except Fail:
                    while k[self.pos] != T.NEWLINE and k[self.pos] != T.EOF:
                        self.advance()
            self.skip_newlines()
        if has_main:
            decls.append(Decl("fn", "main", 1))
        return decls

    def recover_to_top_level(self) -> None:
        k = self.k
        depth = 0
        while True:
            kind = k[self.pos]
            if kind == T.EOF:
                return
            if kind == "{":
                depth += 1
            elif kind == "}":
                self.advance()
                if depth <= 1:
                    return
                depth -= 1
                continue
            elif depth == 0 and kind in _RECOVERY_STOP:
                return
            self.advance()

    def _tombstone(self) -> None:
        tok = self.found()
        self.error(f"The `{tok}` construct is tombstoned and no longer supported. Use standard functions and "
                   "MCP skills instead.", "Tombstoned")
        self.advance()

    def parse_decl(self) -> tuple[str, str]:
        self.skip_newlines()
        kind = self.k[self.pos]
        word = self.v[self.pos] if kind == T.IDENT else None
        if self.reactive_module and kind in REACTIVE_MEMBERS:
            return self.parse_reactive_module()
        if kind in _FN_START:
            return self._fn_decl(set())
        if kind in _WRAPPERS:
            return self.parse_wrapper(kind)
        if kind == "import":
            return self.parse_import()
        if kind == "component":
            return self.parse_component()
        if kind == "let":
            self.advance()
            self.eat("mut")
            name = self.parse_ident_name()
            if self.eat(":"):
                self.parse_type_expr()
            self.expect("=")
            self.parse_expr()
            return ("let_const", name)
        if kind == "async":
            self.advance()
            if self.k[self.pos] in _FN_START:
                return self._fn_decl({"async"})
            raise self.fail("Expected fn after async")
        if kind == "pub":
            self.advance()
            kind = self.k[self.pos]
            if kind in _FN_START:
                return self._fn_decl({"pub"})
            if kind == "type":
                return self.parse_typedef()
            if self.is_ident("url"):
                return self.parse_url_decl()
            if self.is_ident("state_machine"):
                return self.parse_state_machine_decl()
            if self.is_ident("partial"):
                self.advance()
                if self.is_ident("state_machine"):
                    return self.parse_state_machine_decl()
                raise self.fail("Expected `state_machine` after `partial`")
            raise self.fail("Expected fn or type after pub")
        if kind == "type":
            return self.parse_typedef()
        if kind == "@table":
            return self.parse_table()
        if kind == "@index":
            return self.parse_index()
        if kind in TOMBSTONED:
            self._tombstone()
            raise Fail
        if kind == "extern":
            fn = self.parse_extern_fn()
            return (fn.kind(), fn.name)
        if kind == "fragment":
            return self.parse_fragment()
        if kind == "@v0":
            return self.parse_v0()
        if kind == "@form":
            return self.parse_form()
        if kind == "@back_button":
            return self.parse_key_block("back_button", False)
        if kind == "@push":
            return self.parse_key_block("push", False)
        if kind == "@deep_link":
            return self.parse_key_block("deep_link", True)
        if kind == "@tokens":
            return self.parse_tokens_block()
        if kind == "workflow" or kind == "activity":
            return self.parse_workflow_like(kind)
        if kind == "@distributed_train":
            return self.parse_distributed_train()
        if kind == "actor":
            return self.parse_actor()
        if word == "url":
            return self.parse_url_decl()
        if word == "state_machine":
            return self.parse_state_machine_decl()
        if word == "partial":
            self.advance()
            if self.is_ident("state_machine"):
                return self.parse_state_machine_decl()
            raise self.fail("Expected `state_machine` after `partial`")
        if word == "routes":
            return self.parse_routes()
        self.error(f"Unexpected token at top level: {self.found()}", "TopLevel")
        raise Fail

    def _fn_decl(self, flags: set[str]) -> tuple[str, str]:
        fn = self.parse_fn_decl(flags)
        return (fn.kind(), fn.name)

    def parse_wrapper(self, kind: str) -> tuple[str, str]:
        """Decorators that wrap exactly one fn: @endpoint, @test, @forall, @scheduled, @loading, MCP."""
        self.advance()
        k = self.k
        report = _WRAPPERS[kind]
        if kind == "@endpoint":
            self.expect("(")
            ep = None
            if self.is_ident("kind"):
                self.advance()
                self.expect(":")
                if k[self.pos] == T.IDENT:
                    ep = self.v[self.pos]
                    if ep not in ("query", "mutation", "server"):
                        raise self.fail("Unknown endpoint kind. Expected query, mutation, or server.")
                    self.advance()
            self.expect(")")
            if ep is None:
                raise self.fail("Expected `kind: query`, `kind: mutation`, or `kind: server` inside `@endpoint(...)`.")
            report = f"endpoint[{ep}]"
        elif kind == "@test":
            if self.eat("("):
                self.eat(T.STR)
                self.eat(")")
        elif kind == "@forall":
            if self.eat("("):
                if not self.eat(T.STR):
                    while not self.eat(")") and k[self.pos] != T.EOF:
                        self.advance()
                self.eat(")")
        elif kind == "@scheduled":
            self.skip_newlines()
            if not self.eat("("):
                raise self.fail("Expected `(` after @scheduled")
            if not self.eat(T.STR):
                raise self.fail('Expected string literal schedule in @scheduled("...")')
            self.expect(")")
        elif kind in ("@tool", "@mcp.tool"):
            self.eat(T.STR)
        elif kind in ("@resource", "@mcp.resource"):
            if self.eat("("):
                if not self.eat(T.STR):
                    raise self.fail("Expected string literal for resource URI")
                self.expect(",")
                if not self.eat(T.STR):
                    raise self.fail("Expected string literal for resource description")
                self.expect(")")
            elif self.eat(T.STR):
                if not self.eat(T.STR):
                    raise self.fail("Expected second string literal (description) after resource URI")
            else:
                raise self.fail("Expected `(` or string literal after @mcp.resource")
        self.skip_newlines()
        fn = self.parse_fn_decl()
        return (report, fn.name)

    # -- imports ----------------------------------------------------------------------------------
    def parse_import(self) -> tuple[str, str]:
        self.advance()  # import
        names: list[str] = []
        while True:
            if self.is_ident("rust"):
                names.append(self._rust_import())
            elif self.is_ident("react") and self.k[self.pos + 1] in (T.IDENT, T.TYPE_IDENT):
                self.advance()
                name = self.parse_ident_name()
                if not self.is_ident("from"):
                    raise self.fail(f"Expected `from` after react import name, found {self.found()}")
                self.advance()
                if not (self.eat(T.STR) or self.eat(T.SSTR)):
                    raise self.fail("Expected module path string after `from`")
                names.append(f"react:{name}")
            else:
                names.extend(self._symbol_import())
            if not self.eat(","):
                break
        return ("import", ",".join(names))

    def _import_segment(self) -> str | None:
        kind = self.k[self.pos]
        if kind == T.IDENT or kind == T.TYPE_IDENT:
            self.advance()
            return self.v[self.pos - 1]  # type: ignore[return-value]
        if kind == "env" or kind == "http":
            self.advance()
            return kind
        return None

    def _symbol_import(self) -> list[str]:
        first = self._import_segment()
        if first is None:
            raise self.fail("Import path must begin with an identifier (for example `lib.chrome.StateChip` or "
                            "`lib/chrome as { StateChip }`).")
        segments = [first]
        while self.k[self.pos] in (".", "/"):
            self.advance()
            seg = self._import_segment()
            if seg is None:
                break
            segments.append(seg)
        base = ".".join(segments)
        if not self.is_ident("as"):
            return [base]
        self.advance()
        if not self.eat("{"):
            self.parse_ident_name()
            return [base]
        out: list[str] = []
        while self.k[self.pos] != "}":
            if self.k[self.pos] not in (T.IDENT, T.TYPE_IDENT):
                raise self.fail("Expected identifier inside destructured import `as { ... }`.")
            out.append(f"{base}.{self.v[self.pos]}")
            self.advance()
            if self.is_ident("as"):
                self.advance()
                self.parse_ident_name()
            if not self.eat(","):
                break
        self.expect("}")
        return out

    def _rust_import(self) -> str:
        self.advance()  # rust
        if not self.eat(":"):
            # `rust` alone is an ordinary path segment
            self.pos -= 1
            return ",".join(self._symbol_import())
        if self.k[self.pos] not in (T.IDENT, T.TYPE_IDENT):
            raise self.fail("Rust import must include a crate name after `rust:` "
                            "(for example `import rust:serde_json`).")
        crate = self.v[self.pos]
        self.advance()
        k = self.k
        if self.eat("("):
            while True:
                if self.eat(")"):
                    break
                if k[self.pos] != T.IDENT:
                    raise self.fail("Expected metadata key or `)` in rust import metadata list.")
                key = self.v[self.pos]
                self.advance()
                self.expect(":")
                if k[self.pos] in (T.STR, T.IDENT, T.TYPE_IDENT):
                    self.advance()
                else:
                    raise self.fail("Rust import metadata values must be string or identifier.")
                if key not in ("version", "path", "git", "rev", "branch"):
                    raise self.fail(f"Unknown rust import metadata key `{key}`; expected one of version/path/git/rev.")
                if self.eat(","):
                    continue
                if self.eat(")"):
                    break
                raise self.fail("Expected `,` or `)` after rust import metadata item.")
        if self.is_ident("as"):
            self.advance()
            self.parse_ident_name()
        return f"rust:{crate}"
