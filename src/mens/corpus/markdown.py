"""Markdown docs as corpus input: YAML frontmatter, fenced code blocks of a language, their heading and prose.

A block's context is the nearest heading above it plus the prose between that heading and the block,
which becomes the prompt of a doc-context pair. Run: used by `mens corpus extract` and `pairs --docs`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from mens.corpus.safe_yaml import parse_yaml
from mens.errors import ConfigError

SKIP_MARKERS = ("vox:skip", "Skip-Test", "todo!(", "empty-body", "{{#include")
"""Upstream doc-test skip sentinels: a block holding one is not required to parse, so it is not trained on."""

_FENCE_OPEN = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^\s`]*)")
_HEADING_OPEN = re.compile(r"\s{0,3}#{1,6}\s")
# Link text and target stop at the next bracket/paren, so a page of unclosed `[` or `(` scans linearly.
_LINK = re.compile(r"\[([^\[\]]+)\]\([^()]*\)")
_BULLET = re.compile(r"([-*+]|\d+\.)\s+")
MAX_CONTEXT_CHARS = 400


@dataclass
class DocBlock:
    """One fenced block: 1-based index within its page, first/last content line, code, heading and prose."""

    index: int
    first_line: int
    last_line: int
    code: str
    heading: str | None
    context: str
    skip_markers: list[str] = field(default_factory=list)


def parse_frontmatter(text: str) -> tuple[dict, int]:
    """The page's `---` YAML frontmatter as a dict (empty when absent or malformed) and the body's first line."""
    if not text.startswith("---"):
        return {}, 1
    lines = text.splitlines()
    for i in range(1, len(lines)):
        if lines[i].strip() == "---":
            try:  # bounded: size cap, no aliases, no unbounded nesting (a page is data, not a config)
                meta = parse_yaml("\n".join(lines[1:i]), "frontmatter") or {}
            except ConfigError:
                meta = {}
            return (meta if isinstance(meta, dict) else {}), i + 2
    return {}, 1


def page_eligible(meta: dict, path: str) -> tuple[bool, str]:
    """Whether a page may be trained on, and why not: `training_eligible: false`, deprecated, or archive/."""
    if str(meta.get("training_eligible", "true")).lower() == "false":
        return False, "frontmatter training_eligible: false"
    if str(meta.get("status", "")).lower() == "deprecated":
        return False, "frontmatter status: deprecated"
    if "/archive/" in "/" + path.replace("\\", "/"):
        return False, "page is under archive/"
    return True, ""


def _prose(lines: list[str]) -> str:
    """Paragraph text only: no quotes, rules, tables, HTML comments or list bullets' markers."""
    out = []
    for line in lines:
        s = line.strip()
        if not s or s.startswith((">", "|", "<!--", "---")):
            continue
        m = _BULLET.match(s)
        out.append(s[m.end():] if m else s)
    # only the first MAX_CONTEXT_CHARS are kept, so the link rewrite needs no more than a few times that
    text = _LINK.sub(r"\1", " ".join(out)[: 8 * MAX_CONTEXT_CHARS]).replace("**", "").replace("__", "")
    return text if len(text) <= MAX_CONTEXT_CHARS else text[: MAX_CONTEXT_CHARS].rsplit(" ", 1)[0] + " …"


def heading_text(line: str) -> str | None:
    """The text of an ATX heading line (`## Title ##` -> `Title`), or None; plain string scans, no backtracking."""
    m = _HEADING_OPEN.match(line)
    if not m:
        return None
    text = line[m.end():].strip()
    if not text:
        return None
    closed = text.rstrip("#").rstrip()  # an optional closing run of `#`
    return closed or text


def iter_blocks(text: str, tags: tuple[str, ...]) -> list[DocBlock]:
    """Every fenced block whose info string is one of `tags`, with heading/prose context and skip markers."""
    lines = text.splitlines()
    _, body_start = parse_frontmatter(text)
    blocks: list[DocBlock] = []
    heading: str | None = None
    prose_start = body_start - 1
    i, index = body_start - 1, 0
    while i < len(lines):
        m = _FENCE_OPEN.match(lines[i])
        if m:
            fence, info = m["fence"], m["info"].lower()
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(fence[0] * len(fence)):
                j += 1
            if info in tags:
                index += 1
                code = "\n".join(lines[i + 1 : j]) + "\n"
                markers = [mk for mk in SKIP_MARKERS if mk in code]
                blocks.append(DocBlock(index, i + 2, j, code, heading, _prose(lines[prose_start:i]), markers))
            i = j + 1
            prose_start = i
            continue
        h = heading_text(lines[i])
        if h is not None:
            heading = h
            prose_start = i + 1
        i += 1
    return blocks
