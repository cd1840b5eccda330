"""Renamed copies of training pairs: the names a request gives, changed alike in the request and in its answer.

A small model that sees the same program several times learns its names along with it; asked later for a similar
program under other names, it writes the memorized ones (a held-out failure reads "expected forall
'abs_never_negative'; got 'abs_value'"). A repeated pair whose declared names are changed, the same way in the
prompt and the answer, asks the model to take its names from the request instead. Only names the answer
declares and the prompt spells out are changed, each to a name of the same shape (snake_case or PascalCase) that
keeps all but one of its words; the renamed answer must parse and declare the renamed names, or the copy is the
original pair. Deterministic for a seed. No torch.
"""

from __future__ import annotations

import random
import re

from mens.lang import Language

WORDS = ("item", "entry", "record", "value", "total", "count", "name", "label", "score", "order", "user", "task",
         "note", "event", "state", "level", "price", "rate", "limit", "page", "view", "card", "panel", "report",
         "status", "queue", "batch", "token", "stamp", "slot", "ticket", "badge", "list", "box", "row", "line",
         "step", "plan", "trip", "room", "seat", "book", "song", "photo", "file", "tag", "shop", "cart", "coin",
         "bill", "fee", "day", "week", "hour", "team", "player", "guest", "member", "client", "store", "stock",
         "parcel", "route", "stop", "signal", "sensor", "meter", "reading", "alert", "notice", "memo", "draft",
         "check", "find", "make", "build", "load", "save", "pick", "sort", "sum", "mark", "track", "clean")
"""Words a new name is made with: plain ones, so a renamed request still reads like a request."""

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
_PASCAL_WORD = re.compile(r"[A-Z][a-z0-9]*|[a-z0-9]+")


def _words(name: str) -> list[str]:
    return [w for w in name.split("_") if w] if "_" in name or not name[:1].isupper() else \
        _PASCAL_WORD.findall(name)


def _join(words: list[str], pascal: bool) -> str:
    return "".join(w[:1].upper() + w[1:] for w in words) if pascal else "_".join(w.lower() for w in words)


def fresh_name(name: str, rng: random.Random, taken: set[str]) -> str | None:
    """A name of `name`'s shape with one word changed (or, for a one-word name, one word added), not in `taken`;
    None when ten tries find none."""
    pascal = name[:1].isupper() and "_" not in name
    words = _words(name)
    if not words:
        return None
    for _ in range(10):
        new = list(words)
        word = rng.choice(WORDS)
        if len(words) == 1:
            new.insert(rng.randrange(2), word)
        else:
            new[rng.randrange(len(words))] = word
        out = _join(new, pascal)
        if out != name and out not in taken and _IDENT.match(out):
            return out
    return None


def _pattern(name: str) -> re.Pattern:
    """Whole-word occurrences of `name`; a lower-case name right after a `.` is a member (`xs.count()`), not it."""
    before = r"(?<![\w])" if name[:1].isupper() else r"(?<![\w.])"
    return re.compile(before + re.escape(name) + r"(?!\w)")


def _plain_word(name: str) -> bool:
    """A lower-case name without `_` or digits (`add`, `clamp`) may be a word of the prose around it."""
    return name.isalpha() and name.islower()


def _spelled_as_code(prompt: str, name: str) -> bool:
    """Every prompt occurrence of `name` is code: in backticks or called (`name(`); a plain word must be, so that
    "add two numbers" keeps its verb when the function `add` is renamed."""
    hits = list(_pattern(name).finditer(prompt))
    if not hits:
        return False
    if not _plain_word(name):
        return True
    return all(prompt[m.start() - 1:m.start()] == "`" or prompt[m.end():m.end() + 1] in ("(", "`") for m in hits)


def _rename(text: str, mapping: dict[str, str]) -> str:
    for old in sorted(mapping, key=len, reverse=True):  # longest first: `add_all` before `add`
        text = _pattern(old).sub(mapping[old], text)
    return text


def _rename_code(code: str, mapping: dict[str, str]) -> str:
    """`_rename` outside string literals: a heading's text ("Contact us") is prose, not the component `Contact`."""
    out, at = [], 0
    for m in _STRING.finditer(code):
        out += [_rename(code[at:m.start()], mapping), m.group()]
        at = m.end()
    return "".join(out) + _rename(code[at:], mapping)


def renamed_pair(prompt: str, response: str, lang: Language, rng: random.Random) -> tuple[str, str, dict] | None:
    """(prompt, response, {old: new}) with the answer's declared names that the prompt spells out renamed, or None
    when there is no such name or the renamed answer would not parse with the same declarations renamed."""
    res = lang.parse(response)
    if not res.ok:
        return None
    keywords = set(lang.feature_kinds)  # every Language names its keywords
    taken = set(re.findall(r"\w+", prompt)) | set(re.findall(r"\w+", response)) | keywords
    mapping: dict[str, str] = {}
    for _, name in res.decls:
        if not name or name in mapping or name in keywords or not _IDENT.match(name) or len(name) < 3:
            continue
        if not _spelled_as_code(prompt, name):
            continue
        new = fresh_name(name, rng, taken)
        if new:
            mapping[name] = new
            taken.add(new)
    if not mapping:
        return None
    new_prompt, new_response = _rename(prompt, mapping), _rename_code(response, mapping)
    check = lang.parse(new_response)
    if not check.ok or check.decls != [(k, mapping.get(n, n)) for k, n in res.decls]:
        return None
    return new_prompt, new_response, mapping


def renamed_copies(rows: list[dict], copies: int, seed: int, lang: Language) -> tuple[list[dict], int]:
    """`copies` passes over prompt/response `rows` (pass by pass, in row order), each row renamed afresh in each
    pass; a row with nothing to rename is repeated as it is. Returns the rows and how many were renamed. Each
    renamed row keeps its fields and records `renamed: {old: new}`."""
    out, renamed = [], 0
    for copy in range(copies):
        for i, row in enumerate(rows):
            rng = random.Random(f"{seed}:{copy}:{i}:{row.get('source', '')}")
            got = renamed_pair(str(row.get("prompt", "")), str(row.get("response", "")), lang, rng)
            if got is None:
                out.append(dict(row))
                continue
            prompt, response, mapping = got
            out.append({**row, "prompt": prompt, "response": response, "renamed": mapping})
            renamed += 1
    return out, renamed
