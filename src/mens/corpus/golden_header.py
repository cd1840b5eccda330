"""The goldens' header comments: `// ---` frontmatter, `// @training_prompt:`, `// ANCHOR:` regions.

The parser ignores these comments; the corpus tools read them for prompts and eligibility and strip them
from training responses (they inflate answers and are not code). Run: used by `mens corpus extract`/`pairs`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# No pattern lets two unbounded runs compete for the same characters (each would backtrack quadratically on a
# long line); free text is captured with a plain `.*` and stripped in Python.
_ANCHOR = re.compile(r"^\s*(?P<c>//|#)\s*ANCHOR(?P<end>_END)?:\s*(?P<name>[\w.-]+)\s*$")
_PROMPT = re.compile(r"^\s*(?://|#)\s*@training_prompt:(?P<text>.*)$")
_KEY = re.compile(r"^\s*(?://|#)\s*(?P<key>[A-Za-z_][\w-]*)\s*:(?P<value>.*)$")
_FENCE = re.compile(r"^\s*(?://|#)\s*---\s*$")


@dataclass
class Header:
    """What a source file's header comments say. Line numbers are 1-based; `anchors` map name -> (start, end)."""

    meta: dict[str, object] = field(default_factory=dict)
    training_prompt: str | None = None
    anchors: dict[str, tuple[int, int]] = field(default_factory=dict)
    header_lines: set[int] = field(default_factory=set)
    """Lines that are header comments (frontmatter, @training_prompt, ANCHOR markers): stripped from responses."""

    @property
    def training_eligible(self) -> bool:
        """False when the header opts out (`training_eligible: false`) or the file is deprecated."""
        return str(self.meta.get("training_eligible", "true")).lower() != "false" and str(
            self.meta.get("status", "")).lower() != "deprecated"

    @property
    def constructs(self) -> list[str]:
        value = self.meta.get("constructs")
        return value if isinstance(value, list) else []

    @property
    def description(self) -> str | None:
        """The task description: `@training_prompt`, else frontmatter `description`, else None."""
        desc = self.meta.get("description")
        return self.training_prompt or (desc if isinstance(desc, str) and desc else None)


def _value(raw: str) -> object:
    raw = raw.strip()
    if raw.startswith("[") and raw.endswith("]"):
        return [item.strip().strip("'\"") for item in _split_list(raw[1:-1]) if item.strip()]
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
        return raw[1:-1]
    return raw


def _split_list(body: str) -> list[str]:
    """Split `a, b(c, d), e` on top-level commas (constructs like `@endpoint(kind: query)` hold commas)."""
    items, depth, cur = [], 0, []
    for ch in body:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    items.append("".join(cur))
    return items


def parse_header(text: str) -> Header:
    """Read frontmatter, `@training_prompt` and ANCHOR regions from a source text (never raises)."""
    header = Header()
    lines = text.splitlines()
    i = 0
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i < len(lines) and _FENCE.match(lines[i]):  # frontmatter: `// ---` … `// ---` at the top
        for j in range(i + 1, len(lines)):
            if _FENCE.match(lines[j]):
                header.header_lines.update(range(i + 1, j + 2))
                for k in range(i + 1, j):
                    m = _KEY.match(lines[k])
                    if m:
                        header.meta[m["key"]] = _value(m["value"].strip())
                break
            if not lines[j].lstrip().startswith(("//", "#")):
                break  # not a frontmatter block after all
    open_anchors: dict[str, int] = {}
    for no, line in enumerate(lines, start=1):
        m = _PROMPT.match(line)
        if m and m["text"].strip():
            header.training_prompt = header.training_prompt or m["text"].strip()
            header.header_lines.add(no)
            continue
        m = _ANCHOR.match(line)
        if m:
            header.header_lines.add(no)
            if m["end"]:
                start = open_anchors.pop(m["name"], None)
                if start is not None:
                    header.anchors[m["name"]] = (start + 1, no - 1)
            else:
                open_anchors[m["name"]] = no
    return header


def strip_header(text: str, header: Header | None = None, first_line: int = 1) -> str:
    """`text` without header-comment lines and surrounding blank lines; `first_line` is text's line in its file."""
    header = header or parse_header(text)
    kept = [line for no, line in enumerate(text.splitlines(), start=first_line) if no not in header.header_lines]
    return "\n".join(kept).strip("\n") + "\n"


def strip_marker_lines(text: str) -> str:
    """Drop `@training_prompt` and ANCHOR marker lines and a leading frontmatter block from any snippet."""
    return strip_header(text, parse_header(text))
