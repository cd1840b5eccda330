"""Expressions: the Pratt loop, primaries, postfix chains, view-calls, match/if/for, lambdas.

Binary operators and postfix `(`/`.`/`[` never continue across a newline: the NEWLINE token stops them.
"""

from __future__ import annotations

from mens.lang.vox import tokens as T
from mens.lang.vox.core import Fail
from mens.lang.vox.parse_stmt import StmtRules

# operator -> (left bp, right bp); all left-associative.
_INFIX = {
    "|>": (1, 2), "or": (3, 4), "and": (5, 6), "with": (5, 6),
    "is": (7, 8), "==": (7, 8), "isnt": (7, 8), "!=": (7, 8),
    "<": (9, 10), ">": (9, 10), "<=": (9, 10), ">=": (9, 10),
    "+": (11, 12), "-": (11, 12), "*": (13, 14), "/": (13, 14), "%": (13, 14),
}

PRIMITIVE_TAGS = frozenset(
    "stack column row wrap text heading link image button panel card list list_item route_outlet overlay toast "
    "drawer modal".split()
)
HTML_VIEW_TAGS = frozenset(
    "input label textarea select option form fieldset legend table thead tbody tfoot tr th td caption audio "
    "video source track canvas svg img span br hr i b em strong small code pre kbd abbr cite blockquote q head "
    "meta title link script style noscript main section article aside header footer nav details summary dialog "
    "figure figcaption iframe embed object param g defs path circle rect ellipse line polyline polygon text "
    "tspan use symbol marker mask pattern stop filter radial_gradient linear_gradient clip_path foreign_object "
    "fe_gaussian_blur".split()
)

# Literal tokens that are a whole primary by themselves.
_ATOMS = frozenset((T.INT, T.FLOAT, T.DEC, T.STR, T.SSTR, "true", "false"))
_NAME_EXPR_KEYWORDS = frozenset(("env", "to", "http"))

# Light expression shapes: only what later rules look at (bare names, tuples, literals).
_NAME = "name"
_TUPLE = "tuple"
_OTHER = "other"


def is_view_callee(name: str) -> bool:
    return name[:1].isupper() or name in PRIMITIVE_TAGS or name in HTML_VIEW_TAGS


class ExprRules(StmtRules):
    def parse_expr(self):
        self.skip_newlines()
        return self.parse_expr_bp(0)

    def parse_expr_bp(self, min_bp: int):
        self.enter()
        try:
            lhs = self.parse_primary()
            k = self.k
            infix = _INFIX
            while True:
                kind = k[self.pos]
                if kind == "?":
                    self.advance()
                    lhs = (_OTHER, None)
                    continue
                bp = infix.get(kind)
                if bp is None or bp[0] < min_bp:
                    return lhs
                self.advance()
                self.parse_expr_bp(bp[1])
                lhs = (_OTHER, None)
        finally:
            self.depth -= 1

    def parse_primary(self):
        kind = self.k[self.pos]
        if kind in _ATOMS:
            self.advance()
            expr = (_OTHER, self.v[self.pos - 1] if kind == T.STR or kind == T.SSTR else None)
            if kind == T.INT:
                expr = ("int", self.v[self.pos - 1])
            elif kind == T.STR or kind == T.SSTR:
                expr = ("str", self.v[self.pos - 1])
        elif kind == T.IDENT or kind == T.TYPE_IDENT:
            name = self.v[self.pos]
            self.advance()
            if self.eat("=>"):
                self.parse_expr()
                expr = (_OTHER, None)
            else:
                expr = (_NAME, name)
        elif kind == "not" or kind == "-":
            self.advance()
            self.enter()
            try:
                self.parse_primary()
            finally:
                self.depth -= 1
            expr = (_OTHER, None)
        elif kind == "(":
            expr = self.parse_paren()
        elif kind == "[":
            self.advance()
            self.enter()
            try:
                k = self.k
                while k[self.pos] != "]" and k[self.pos] != T.EOF:
                    self.skip_newlines()
                    if k[self.pos] == "]" or k[self.pos] == T.EOF:
                        break
                    self.parse_expr()
                    self.skip_newlines()
                    if not self.eat(","):
                        break
                self.skip_newlines()
                self.expect("]")
            finally:
                self.depth -= 1
            expr = (_OTHER, None)
        elif kind == "{":
            self.parse_brace_expr()
            expr = (_OTHER, None)
        elif kind == "match":
            self.parse_match()
            expr = (_OTHER, None)
        elif kind == "if":
            self.parse_if()
            expr = (_OTHER, None)
        elif kind == "for":
            self.parse_for()
            expr = (_OTHER, None)
        elif kind == "fn":
            self.parse_lambda()
            expr = (_OTHER, None)
        elif kind == "@cancellable":
            self.advance()
            self.parse_lambda()
            expr = (_OTHER, None)
        elif kind == "spawn":
            self.advance()
            self.expect("(")
            self.parse_expr()
            self.expect(")")
            expr = (_OTHER, None)
        elif kind == "side_effect":
            self.advance()
            self.expect("{")
            self.parse_block()
            expr = (_OTHER, None)
        elif kind == "workflow":
            self.parse_workflow_version()
            expr = (_OTHER, None)
        elif kind in _NAME_EXPR_KEYWORDS:
            self.advance()
            expr = (_NAME, kind)
        else:
            self.error(f"Unexpected token in expression: {self.found()}", "Expression")
            raise Fail
        return self.parse_postfix(expr)

    def parse_postfix(self, expr):
        k = self.k
        while True:
            kind = k[self.pos]
            if kind == "(":
                self.advance()
                all_named = self.parse_args()
                self.expect(")")
                if expr[0] == _NAME and all_named and is_view_callee(expr[1]):
                    i = self.pos
                    while k[i] == T.NEWLINE:
                        i += 1
                    if k[i] == "{":
                        self.pos = i + 1
                        self.parse_view_children()
                        self.expect("}")
                expr = (_OTHER, None)
            elif kind == ".":
                self.advance()
                self.parse_ident_name()
                if self.eat("("):
                    self.parse_args()
                    self.expect(")")
                expr = (_OTHER, None)
            elif kind == "[":
                self.advance()
                self.parse_expr()
                self.expect("]")
                expr = (_OTHER, None)
            else:
                return expr

    def parse_args(self) -> bool:
        """Call arguments up to (not including) `)`; returns whether every argument is named."""
        k = self.k
        all_named = True
        self.skip_newlines()
        while k[self.pos] != ")" and k[self.pos] != T.EOF:
            if k[self.pos] == T.IDENT and k[self.pos + 1] == "=":
                self.pos += 2
            else:
                all_named = False
            self.parse_expr()
            self.skip_newlines()
            if not self.eat(","):
                break
            self.skip_newlines()
        return all_named

    def parse_view_children(self) -> None:
        k = self.k
        self.skip_newlines()
        while k[self.pos] != "}" and k[self.pos] != T.EOF:
            self.parse_expr()
            self.skip_newlines()
            self.eat(",")
            self.skip_newlines()

    def parse_paren(self):
        self.advance()  # (
        self.enter()
        try:
            first = self.parse_expr()
            items = [first]
            if self.eat(","):
                k = self.k
                while True:
                    self.skip_newlines()
                    if k[self.pos] == ")":
                        break
                    items.append(self.parse_expr())
                    if not self.eat(","):
                        break
                self.skip_newlines()
                self.expect(")")
                expr = (_TUPLE, items)
            else:
                self.skip_newlines()
                self.expect(")")
                expr = first
            if self.eat("=>"):
                params = expr[1] if expr[0] == _TUPLE else [expr]
                for item in params:
                    if item[0] != _NAME:
                        self.error("Expected identifier in lambda parameters", "Expression")
                        raise Fail
                self.parse_expr()
                return (_OTHER, None)
            return expr
        finally:
            self.depth -= 1

    def parse_brace_expr(self) -> None:
        k = self.k
        i = self.pos + 1
        while k[i] == T.NEWLINE:
            i += 1
        if k[i] == "}":
            self.pos = i + 1 if i < self.last else i
            return
        if k[i] in (T.IDENT, T.TYPE_IDENT, T.STR, T.SSTR):
            j = i + 1
            while k[j] == T.NEWLINE:
                j += 1
            if k[j] == ":":
                self.parse_object_lit()
                return
        self.advance()
        self.parse_block()

    def parse_object_lit(self) -> None:
        self.advance()  # {
        k = self.k
        while k[self.pos] != "}" and k[self.pos] != T.EOF:
            self.skip_newlines()
            if k[self.pos] == "}" or k[self.pos] == T.EOF:
                break
            if k[self.pos] in (T.IDENT, T.TYPE_IDENT, T.STR, T.SSTR):
                self.advance()
            else:
                self.error("Expected identifier or string as object key", "Expression")
                raise Fail
            self.expect(":")
            self.parse_expr()
            if not self.eat(","):
                break
        self.skip_newlines()
        self.expect("}")

    def parse_match(self) -> None:
        self.advance()  # match
        self.parse_expr()
        self.expect("{")
        k = self.k
        while True:
            self.skip_newlines()
            if k[self.pos] == "}" or k[self.pos] == T.EOF:
                break
            self.parse_pattern()
            if self.eat("->"):
                self.error("The '->' syntax is deprecated for match arms. Use '=>'.", "Expression")
            else:
                self.expect("=>")
            if k[self.pos] in ("return", "break", "continue"):
                self.parse_stmt()
            else:
                self.parse_expr()
            self.skip_newlines()
            self.eat(",")
        self.eat("}")

    def parse_if(self) -> None:
        self.advance()  # if
        self.parse_expr()
        self.expect("{")
        self.parse_block()
        self.skip_newlines()
        if self.eat("else"):
            self.skip_newlines()
            if self.k[self.pos] == "if":
                self.enter()
                try:
                    self.parse_if()
                finally:
                    self.depth -= 1
            else:
                self.expect("{")
                self.parse_block()

    def parse_for(self) -> None:
        self.advance()  # for
        self.parse_ident_name()
        if self.eat(","):
            self.parse_ident_name()
        self.expect("in")
        self.parse_expr()
        if self.is_ident("key"):
            self.advance()
            self.expect("=")
            self.parse_expr()
        self.parse_expr()

    def parse_lambda(self) -> None:
        self.advance()  # fn
        self.expect("(")
        self.parse_params()
        self.expect(")")
        if self.eat_return_arrow():
            self.parse_type_expr()
        self.parse_expr()

    def parse_workflow_version(self) -> None:
        self.advance()  # workflow
        self.expect(".")
        method = self.parse_ident_name()
        if method != "version":
            self.error(f"expected `version` after `workflow.`, got `{method}`", "Expression")
            raise Fail
        self.expect("(")
        start = self.pos
        self.parse_args()
        self.expect(")")
        # Upstream checks the literal shapes of the three arguments.
        args = self._plain_args(start)
        if not args or args[0] != T.STR:
            self.error("workflow.version arg 1 must be a string literal", "Expression")
            raise Fail
        for n in (1, 2):
            if len(args) <= n or args[n] != T.INT:
                self.error(f"workflow.version arg {n + 1} must be a non-negative int", "Expression")
                raise Fail

    def _plain_args(self, start: int) -> list[str]:
        """Kinds of single-token arguments between `start` and the closing `)` (others read as OTHER)."""
        k = self.k
        out: list[str] = []
        i = start
        end = self.pos - 1
        while i < end:
            j = i
            while j < end and k[j] != ",":
                j += 1
            toks = [t for t in k[i:j] if t != T.NEWLINE]
            out.append(toks[0] if len(toks) == 1 else "OTHER")
            i = j + 1
        return out
