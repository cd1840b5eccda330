"""Benchmark tasks: what is asked, and what a correct answer must declare and contain.

Two formats load: our JSONL (one task a line, with an `expect` object) and the original's
`vox_mens_bench_manifest_v1` JSON manifest (`benchmarks: [{id, category, description, file?,
context_files?, semantic_expected_contains?}]`). No torch.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mens.errors import DataError
from mens.lang.checks import Expect

MANIFEST_SCHEMA = "vox_mens_bench_manifest_v1"
DEFAULT_BENCH = "vox_default"


class BenchTask(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str
    category: str = "general"
    prompt: str = Field(description="The request as the user writes it.")
    expect: Expect = Field(default_factory=Expect)
    split: str = Field(default="heldout", description="heldout (never trained on) or dev.")


def _task_from_manifest(item: dict, bench_dir: Path) -> BenchTask:
    desc = item.get("description") or ""
    parts = []
    ctx = item.get("context_files") or []
    if ctx:
        parts.append("You are given the following Vox source files as context (read-only):\n")
        for rel in ctx:
            text = (bench_dir / rel).read_text(encoding="utf-8") if (bench_dir / rel).is_file() else ""
            parts.append(f"### {rel}\n{text}\n")
        parts.append("---\n\n")
    body = f"Write a Vox program that: {desc}" if desc else ""
    file = item.get("file")
    if file and (bench_dir / file).is_file():
        text = (bench_dir / file).read_text(encoding="utf-8")
        spec = f"Primary file `{file}` (starter or spec you may replace):\n```vox\n{text}\n```"
        body = f"{body}\n\n{spec}" if body else spec
    parts.append(body)
    return BenchTask(
        id=str(item["id"]),
        category=item.get("category") or "general",
        prompt="".join(parts),
        expect=Expect(contains=list(item.get("semantic_expected_contains") or [])),
    )


def load_bench(path: str | Path | None = None) -> list[BenchTask]:
    """Tasks from a JSONL file, a manifest JSON (or a folder holding manifest.json), or the shipped default."""
    if path is None or str(path) == DEFAULT_BENCH:
        text = resources.files("mens.evaluate").joinpath("data", f"{DEFAULT_BENCH}.jsonl").read_text("utf-8")
        return _load_jsonl(text, f"<mens>/evaluate/data/{DEFAULT_BENCH}.jsonl")
    p = Path(path)
    if p.is_dir():
        p = p / "manifest.json"
    if not p.is_file():
        raise DataError(f"bench {path}: no such file; pass a .jsonl of tasks, a manifest.json or its folder")
    text = p.read_text(encoding="utf-8")
    if p.suffix == ".json":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{p}:{e.lineno}: malformed JSON: {e.msg}") from None
        items = doc.get("benchmarks") if isinstance(doc, dict) else None
        if not isinstance(items, list):
            raise DataError(f"{p}: expected a {MANIFEST_SCHEMA} manifest with a 'benchmarks' list")
        tasks = []
        for i, item in enumerate(items):
            if not isinstance(item, dict) or "id" not in item:
                raise DataError(f"{p}: benchmarks[{i}] needs at least an 'id' and a 'description'")
            tasks.append(_task_from_manifest(item, p.parent))
        return tasks
    return _load_jsonl(text, str(p))


def _load_jsonl(text: str, where: str) -> list[BenchTask]:
    tasks, problems, seen = [], [], set()
    for no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            task = BenchTask.model_validate_json(line)
        except ValidationError as e:
            first = e.errors()[0]
            problems.append(f"{where}:{no}: {'.'.join(map(str, first['loc'])) or 'task'}: {first['msg']}")
            continue
        if task.id in seen:
            problems.append(f"{where}:{no}: duplicate task id {task.id!r}")
        seen.add(task.id)
        tasks.append(task)
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise DataError("invalid bench tasks: " + "; ".join(problems[:5]) + more)
    if not tasks:
        raise DataError(f"{where}: no tasks; each line must be a JSON task with id, prompt and expect")
    return tasks


def heldout_names(path: str | Path | None = None) -> frozenset[str]:
    """Every name a held-out task of the bench expects (generated training pairs must not declare one)."""
    return frozenset(n for task in load_bench(path) if task.split == "heldout" for n in task.expect.declared_names())


def load_references(path: str | Path | None = None) -> dict[str, str]:
    """Reference answers by task id: `<bench stem>_reference.jsonl` beside the bench (`{"id", "answer"}` a line).

    The shipped default bench has one for every task (they prove each task achievable, and `mens dogfood`
    drops training pairs whose code equals a held-out answer). A bench without references gives {}.
    """
    if path is None or str(path) == DEFAULT_BENCH:
        ref = resources.files("mens.evaluate").joinpath("data", f"{DEFAULT_BENCH}_reference.jsonl")
        text, where = ref.read_text("utf-8"), f"<mens>/evaluate/data/{DEFAULT_BENCH}_reference.jsonl"
    else:
        p = Path(path)
        ref_path = (p if p.is_dir() else p.parent) / f"{'manifest' if p.is_dir() else p.stem}_reference.jsonl"
        if not ref_path.is_file():
            return {}
        text, where = ref_path.read_text(encoding="utf-8"), str(ref_path)
    refs: dict[str, str] = {}
    for no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            refs[str(row["id"])] = str(row["answer"])
        except (json.JSONDecodeError, KeyError, TypeError):
            raise DataError(f"{where}:{no}: expected a JSON object with 'id' and 'answer'") from None
    return refs
