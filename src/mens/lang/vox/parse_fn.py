"""Function heads: fn decorators, `fn name<T>(params) [uses ...] [to T] { body }`, extern fns, `uses` clauses."""

from __future__ import annotations

from mens.lang.vox import tokens as T
from mens.lang.vox.ast import FnInfo
from mens.lang.vox.core import Fail
from mens.lang.vox.parse_expr import ExprRules

EFFECTS = frozenset("net db fs env clock random gpu_compute mutate nothing".split())
_NO_ARG_DECORATORS = {
    "@pure": "pure", "@deprecated": "deprecated", "@reactive": None, "@remote": None, "@fuzz": None,
    "@native": None, "@training_step": None,
}
# Decorators whose `(key [=] value, ...)` lists are read leniently; the value is consumed only when it
# has the expected shape. The sets say which token kinds count as a value for any key.
_EQ_LISTS = frozenset(("@ai", "@prompt", "@subagent", "@search", "@hole", "@inference"))
_COLON_LISTS = frozenset(("@webhook", "@cors", "@rate_limit", "@layer"))
_LLM = frozenset(("@ai", "@prompt", "@subagent", "@search"))
_SKIP_PARENS = frozenset(("@auth", "@offline_capable", "@collaborative"))

# key -> accepted value token kinds, for the `=` lists.
_EQ_VALUES = {
    "model": (T.STR,), "structured_output": (T.IDENT, T.TYPE_IDENT), "max_iterations": (T.INT,),
    "task_category": (T.IDENT, T.TYPE_IDENT), "tier_max": (T.IDENT, T.TYPE_IDENT),
    "cost_ceiling_usd_per_call": (T.FLOAT, T.INT), "stage": (T.IDENT, T.TYPE_IDENT),
    "schema": (T.IDENT, T.TYPE_IDENT), "policy": (T.IDENT, T.TYPE_IDENT, T.STR), "max_depth": (T.INT,),
    "budget_usd": (T.FLOAT, T.INT), "description": (T.STR,), "parallel": ("true", "false"),
    "complexity": (T.INT,), "corpus": (T.IDENT, T.TYPE_IDENT), "query": (T.STR, T.IDENT, T.TYPE_IDENT),
    "into": (T.IDENT, T.TYPE_IDENT), "top_k": (T.INT,), "spec": (T.STR, T.IDENT, T.TYPE_IDENT),
    "reviewer": (T.IDENT, T.TYPE_IDENT), "cache_key": (T.STR, T.IDENT, T.TYPE_IDENT),
}
_EQ_LIST_KEYS = frozenset(("strengths", "redact", "constraints"))
_COLON_VALUES = {
    "provider": (T.IDENT,), "secret": (T.STR,), "replay_window_secs": (T.INT,),
    "idempotent": ("true", "false", T.IDENT), "allow_credentials": ("true", "false", T.IDENT),
    "by": (T.IDENT,), "window_secs": (T.INT,), "window": (T.INT,), "max": (T.INT,), "max_requests": (T.INT,),
    "tier": (T.IDENT,),
}


class FnRules(ExprRules):
    def parse_fn_decl(self, flags: set[str] | None = None) -> FnInfo:
        flags = set() if flags is None else flags
        k = self.k
        while True:
            self.skip_newlines()
            kind = k[self.pos]
            if kind not in T.FN_DECORATORS:
                break
            self.advance()
            if kind in ("@require", "@invariant"):
                self.expect("(")
                self.parse_expr()
                self.expect(")")
            elif kind == "@ensure":
                self.expect("(")
                self.parse_expr()
                if self.eat(",") and self.is_ident("fallback"):
                    self.advance()
                    self.expect(":")
                    self.parse_ident_name()
                self.expect(")")
            elif kind in _NO_ARG_DECORATORS:
                flag = _NO_ARG_DECORATORS[kind]
                if flag:
                    flags.add(flag)
            elif kind in _EQ_LISTS:
                if kind in _LLM:
                    flags.add("llm")
                if self.eat("("):
                    self._lenient_list("=", _EQ_VALUES, strict_close=kind != "@inference")
            elif kind in _COLON_LISTS:
                if self.eat("("):
                    self._lenient_list(":", _COLON_VALUES, strict_close=False, expect_sep=True)
            elif kind == "@pii":
                if self.eat("("):
                    self._pii_list()
            elif kind == "@embed":
                if self.eat("("):
                    self._lenient_list(":", {"model": (T.STR,), "dimensions": (T.INT,), "source_field": (T.STR,)},
                                       strict_close=False)
            elif kind == "@uses":
                if self.eat("("):
                    self._uses_list()
            elif kind in _SKIP_PARENS:
                if self.eat("("):
                    self.skip_paren_args_inner()
        self.expect("fn")
        name = self.parse_ident_name()
        if self.eat("<"):
            while True:
                self.parse_ident_name()
                if not self.eat(","):
                    break
            self.expect(">")
        self.expect("(")
        self.parse_params()
        self.expect(")")
        self.parse_uses_clause()
        if self.eat_return_arrow():
            self.parse_type_expr()
        if not ("llm" in flags and k[self.pos] != "{"):
            self.expect("{")
            self.parse_block()
        return FnInfo(name, flags)

    def _lenient_list(self, sep: str, values: dict, strict_close: bool, expect_sep: bool = False) -> None:
        k = self.k
        while True:
            self.skip_newlines()
            if k[self.pos] == ")" or k[self.pos] == T.EOF:
                break
            if k[self.pos] == T.IDENT:
                key = self.v[self.pos]
                self.advance()
                if expect_sep:
                    try:
                        self.expect(sep)
                    except Fail:
                        pass
                else:
                    self.eat(sep)
                if key in values:
                    if k[self.pos] in values[key]:
                        self.advance()
                elif sep == "=" and key in _EQ_LIST_KEYS:
                    if self.eat("["):
                        self._lenient_bracket_list()
                elif sep == ":" and key == "origins":
                    if self.eat("["):
                        self._lenient_bracket_list()
                    elif k[self.pos] == T.STR:
                        self.advance()
                else:
                    self.advance()
            else:
                self.advance()
            if not self.eat(","):
                break
        if strict_close:
            self.expect(")")
        else:
            try:
                self.expect(")")
            except Fail:
                pass

    def _lenient_items(self, closer: str, item) -> None:
        """Comma-separated items up to `closer` (newlines skipped); the closer is eaten leniently, as upstream."""
        k = self.k
        while True:
            self.skip_newlines()
            if k[self.pos] == closer or k[self.pos] == T.EOF:
                break
            item()
            if not self.eat(","):
                break
        try:
            self.expect(closer)
        except Fail:
            pass

    def _lenient_bracket_list(self) -> None:
        self._lenient_items("]", self.advance)

    def _pii_list(self) -> None:
        self._lenient_items(")", self._pii_item)

    def _pii_item(self) -> None:
        k = self.k
        if k[self.pos] != T.IDENT:
            self.advance()
            return
        key = self.v[self.pos]
        self.advance()
        if key != "class":
            self.advance()
            return
        try:
            self.expect(":")
        except Fail:
            pass
        if k[self.pos] == T.IDENT:
            self.advance()

    def _uses_list(self) -> None:
        self._lenient_items(")", self._uses_item)

    def _uses_item(self) -> None:
        k = self.k
        if k[self.pos] == T.IDENT and self.v[self.pos] == "mcp":
            self.advance()
            if self.eat("("):
                if k[self.pos] == T.IDENT:
                    self.advance()
                try:
                    self.expect(")")
                except Fail:
                    pass
        else:
            self.advance()

    def skip_paren_args_inner(self) -> None:
        k = self.k
        depth = 1
        while depth > 0 and k[self.pos] != T.EOF:
            if k[self.pos] == "(":
                depth += 1
            elif k[self.pos] == ")":
                depth -= 1
            self.advance()

    def parse_uses_clause(self) -> None:
        if not self.is_ident("uses"):
            return
        self.advance()
        k = self.k
        while True:
            kind = k[self.pos]
            if kind == T.IDENT:
                name = self.v[self.pos]
                if name == "mcp":
                    self.advance()
                    if self.eat("("):
                        if k[self.pos] in (T.IDENT, T.TYPE_IDENT):
                            self.advance()
                        else:
                            self.error("Expected MCP tool name inside `mcp(...)`", "Declaration")
                            return
                        try:
                            self.expect(")")
                        except Fail:
                            pass
                elif name in EFFECTS:
                    self.advance()
                else:
                    self.error(f"Unknown effect `{name}`; expected one of: net, db, fs, env, clock, random, "
                               "gpu_compute, mutate, mcp(…), nothing", "Declaration")
                    return
            elif kind == "env":
                self.advance()
            else:
                self.error("Expected effect name after `uses`", "Declaration")
                return
            if not self.eat(","):
                return

    def parse_extern_fn(self) -> FnInfo:
        self.advance()  # extern
        self.expect("fn")
        name = self.parse_ident_name()
        self.expect("(")
        self.parse_params()
        self.expect(")")
        if self.eat_return_arrow():
            self.parse_type_expr()
        self.expect("=")
        if self.k[self.pos] in (T.STR, T.SSTR):
            self.advance()
        else:
            self.error("Expected string literal module path after `=` in extern fn", "Declaration")
            raise Fail
        return FnInfo(name, {"pub", "extern"})
