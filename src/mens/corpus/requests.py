"""Hand-written requests: what users ask for, worded the way they word it, each with a checked answer.

Task pairs from templates (`mens.corpus.taskgen`) teach each construct's shape, but under a few phrasings per
template; a model trained mostly on them maps a phrasing to one code shape and stumbles on a request worded
otherwise ("a cron job", "an API route", "a unit test called ..."). These requests were written by hand, by
writers who never saw the bench's held-out or confirmation tasks, in varied wording and combinations, and with
the same checks the bench uses (declaration kinds and names, parameters, return type, required contents).

The shipped file is `data/requests/<language>.jsonl`, one JSON object a line:
`{"id", "category", "prompt", "expect", "answer"}` (`expect` as in `mens.lang.checks.Expect`). Every answer
parses and meets its own expectations: `load_requests` checks that and names the line of any that does not.
No torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from pydantic import ValidationError

from mens.corpus.jsonl import read_objects
from mens.corpus.records import BadLine, codegen_row
from mens.errors import DataError
from mens.lang import get_language
from mens.lang.checks import Expect, check_output


@dataclass(frozen=True)
class Request:
    id: str
    category: str
    prompt: str
    expect: Expect
    answer: str


def requests_path(language: str) -> Path | None:
    """The shipped requests file of `language`, or None when the package has none."""
    p = resources.files("mens.corpus").joinpath("data", "requests", f"{language}.jsonl")
    return Path(str(p)) if p.is_file() else None


def load_requests(language: str, path: Path | None = None) -> list[Request]:
    """The requests in `path` (default: the shipped file), each answer checked against its own expectations."""
    path = path or requests_path(language)
    if path is None:
        return []
    lang = get_language(language)
    out, problems, seen = [], [], set()
    if not path.is_file():
        raise DataError(f"--file {path}: no such file; pass a JSONL requests file")
    for no, row in read_objects(path):
        if isinstance(row, BadLine):
            problems.append(f"{path}:{no}: {row.reason}")
            continue
        try:
            req = Request(id=str(row["id"]), category=str(row["category"]), prompt=str(row["prompt"]),
                          expect=Expect.model_validate(row.get("expect") or {}), answer=str(row["answer"]))
        except KeyError as e:
            problems.append(f"{path}:{no}: missing field {e}; each line needs id, category, prompt, expect, answer")
            continue
        except (TypeError, ValidationError) as e:
            first = str(e).splitlines()[0]
            problems.append(f"{path}:{no}: expected a JSON object with id, category, prompt, expect, answer: {first}")
            continue
        if req.id in seen:
            problems.append(f"{path}:{no}: duplicate id {req.id!r}")
        seen.add(req.id)
        res = check_output(req.answer, req.expect, lang)
        if not res.passed:
            problems.append(f"{path}:{no}: {req.id}: the answer fails its own checks: "
                            + "; ".join(r for _, r in res.failures))
        out.append(req)
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise DataError("invalid requests: " + "; ".join(problems[:5]) + more
                        + ". Fix the line (every answer must parse and meet its expect) or remove it.")
    return out


def request_pairs(language: str, path: Path | None = None) -> list[dict]:
    """The requests as training pairs (`vox_dogfood_v1` rows, origin `requests`)."""
    return [codegen_row(language, r.prompt, r.answer, category=f"{language}_request_{r.category}", rating=5,
                        source=f"requests:{r.id}", origin="requests")
            for r in load_requests(language, path)]
