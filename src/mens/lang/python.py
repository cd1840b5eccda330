"""Python as a second, small `Language`, through the stdlib `ast` module.

It proves the protocol is not Vox-shaped: corpus and eval code work on it unchanged.
"""

from __future__ import annotations

import ast
import io
import keyword
import tokenize
import warnings

from mens.lang.base import Diagnostic, Mode, ParseResult

_KINDS = {
    ast.FunctionDef: "fn",
    ast.AsyncFunctionDef: "fn[async]",
    ast.ClassDef: "class",
    ast.Import: "import",
    ast.ImportFrom: "import",
    ast.Assign: "assign",
    ast.AnnAssign: "assign",
}


def _name(node: ast.AST) -> str:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.Import):
        return node.names[0].name
    if isinstance(node, ast.ImportFrom):
        return node.module or ""
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    return ""


class PythonLanguage:
    name = "python"
    file_extensions = (".py",)
    fence_tags = ("python", "py")
    construct_kinds = ("fn", "class", "import", "assign")
    feature_kinds = tuple(keyword.kwlist)

    def parse(self, text: str, mode: Mode = "module") -> ParseResult:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # SyntaxWarning on odd escapes is not a parse failure
                tree = ast.parse(text)
        except SyntaxError as e:
            diag = Diagnostic("error", e.lineno or 1, e.offset or 1, e.msg, "SyntaxError")
            return ParseResult(False, [], [diag])
        except (ValueError, RecursionError, MemoryError) as e:  # null bytes, absurd nesting
            return ParseResult(False, [], [Diagnostic("error", 1, 1, str(e) or type(e).__name__, type(e).__name__)])
        decls = [(_KINDS[type(n)], _name(n)) for n in tree.body if type(n) in _KINDS]
        return ParseResult(True, decls, [])

    def base_kind(self, kind: str) -> str:
        return kind.split("[", 1)[0]

    def features(self, text: str) -> set[str]:
        """Keywords among `text`'s name tokens; those before a tokenize error where the text does not tokenize."""
        found: set[str] = set()
        try:
            for tok in tokenize.generate_tokens(io.StringIO(text).readline):
                if tok.type == tokenize.NAME and keyword.iskeyword(tok.string):
                    found.add(tok.string)
        except (tokenize.TokenError, SyntaxError, ValueError, RecursionError, MemoryError):
            pass
        return found

    def completion_suffix(self, text: str) -> str | None:
        for suffix in ("", "\n    pass\n", ")\n", "]\n", '"\n', "0\n"):
            if self.parse(text + suffix).has_code:
                return suffix
        return None

    def viable_prefix(self, text: str) -> bool:
        """Parses, or fails only because the input ended early (open bracket, string or block)."""
        res = self.parse(text)
        if res.ok:
            return True
        err = res.first_error
        msg = err.message if err else ""
        eof_msgs = ("was never closed", "unexpected EOF", "expected an indented block", "unterminated")
        return any(m in msg for m in eof_msgs)


PYTHON = PythonLanguage()
