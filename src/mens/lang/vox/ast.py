"""A light Vox AST: top-level declarations as `Decl(kind, name, line)`; bodies are not kept.

`kind` uses the reporting spelling of the parity table (`fn[pub+async]`, `endpoint[query]`, `type_struct`).
"""

from __future__ import annotations

from dataclasses import dataclass

# The order flags appear in inside `fn[...]`.
FN_FLAG_ORDER = ("pub", "async", "llm", "pure", "deprecated", "extern")


@dataclass(frozen=True, slots=True)
class Decl:
    """One top-level declaration."""

    kind: str
    name: str
    line: int

    def as_pair(self) -> tuple[str, str]:
        return (self.kind, self.name)


@dataclass(slots=True)
class FnInfo:
    """What the declaration table needs from a parsed `fn` head."""

    name: str
    flags: set[str]

    def kind(self) -> str:
        flags = [f for f in FN_FLAG_ORDER if f in self.flags]
        return f"fn[{'+'.join(flags)}]" if flags else "fn"


def base_kind(kind: str) -> str:
    """`fn[pub+async]` -> `fn`, `endpoint[query]` -> `endpoint`."""
    i = kind.find("[")
    return kind if i < 0 else kind[:i]
