"""The held-out bench of a dogfood run, and training data that provably does not overlap it.

A training pair is dropped when its code equals a held-out reference answer after normalization
(comments removed, whitespace collapsed; compared by sha256), or when its prompt is a near-duplicate of a
held-out prompt (Jaccard similarity of word 3-gram shingles >= PROMPT_NEAR_DUP). Every dropped pair is
listed with the task it collides with, so the split can be audited. No torch.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from mens.corpus.jsonl import read_objects, write_jsonl
from mens.corpus.normalize import code_in_response, normalize_code
from mens.corpus.records import BadLine, codegen_row
from mens.evaluate.bench import BenchTask, load_bench, load_references
from mens.run_records import HeldoutSplit, write_json

PROMPT_NEAR_DUP = 0.5
"""Word 3-gram Jaccard at or above which a training prompt counts as a copy of a held-out prompt."""
SAME_CODE = "same code as held-out answer"
NEAR_DUPLICATE_PROMPT = "near-duplicate prompt"
"""The two reasons a dropped row is listed with (`SplitReport.dropped`), named once for whoever counts them."""
_WORD = re.compile(r"[a-z0-9_]+")


def code_hash(code: str, comment: str = "//") -> str:
    """sha256 of the code with comments removed and whitespace collapsed."""
    return hashlib.sha256(normalize_code(code, comment).encode("utf-8")).hexdigest()


def shingles(text: str, n: int = 3) -> set[tuple[str, ...]]:
    words = _WORD.findall(text.lower())
    if len(words) < n:
        return {tuple(words)} if words else set()
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a and b else 0.0


@dataclass
class SplitReport:
    """What the decontamination kept and dropped: `rows_in == kept + len(dropped)`."""

    rows_in: int = 0
    kept: int = 0
    heldout_tasks: int = 0
    references: int = 0
    dropped: list[dict] = field(default_factory=list)
    max_prompt_similarity: float = 0.0
    """The highest prompt similarity among the pairs that were kept (below the threshold by construction)."""

    def to_json(self) -> dict:
        return HeldoutSplit(rows_in=self.rows_in, kept=self.kept, dropped=len(self.dropped),
                            heldout_tasks=self.heldout_tasks, reference_answers=self.references,
                            prompt_near_dup_threshold=PROMPT_NEAR_DUP,
                            max_kept_prompt_similarity=round(self.max_prompt_similarity, 4),
                            dropped_rows=self.dropped).to_json()


def heldout_tasks(bench: str | None, split: str) -> tuple[list[BenchTask], dict[str, str]]:
    """The bench's tasks in `split` (all tasks for "all") and their reference answers."""
    tasks = [t for t in load_bench(bench) if split == "all" or t.split == split]
    refs = load_references(bench)
    return tasks, {t.id: refs[t.id] for t in tasks if t.id in refs}


def dev_pairs(bench: str | None, language: str) -> list[dict]:
    """The bench's dev tasks with their reference answers as training pairs (the dev split is never evaluated as
    held-out; the held-out decontamination still runs over these rows like any other)."""
    tasks, refs = heldout_tasks(bench, "dev")
    return [codegen_row(language, t.prompt, refs[t.id], category=f"{language}_bench_dev_{t.category}", rating=5,
                        source=f"bench-dev:{t.id}", origin="bench_dev")
            for t in tasks if t.id in refs]


def _row_text(row: dict) -> tuple[str, str]:
    """(prompt, response) of a prompt/response row or a `messages` row (last user and assistant turns)."""
    if "messages" in row and isinstance(row["messages"], list):
        users = [m.get("content", "") for m in row["messages"] if m.get("role") == "user"]
        answers = [m.get("content", "") for m in row["messages"] if m.get("role") == "assistant"]
        return (users[-1] if users else ""), (answers[-1] if answers else "")
    return str(row.get("prompt", "")), str(row.get("response", ""))


def decontaminate(rows: list[dict], tasks: list[BenchTask], refs: dict[str, str],
                  tags: tuple[str, ...] = ("vox",)) -> tuple[list[dict], SplitReport]:
    """Rows that overlap no held-out task (by code hash or prompt near-duplicate), and the report."""
    answer_hashes = {code_hash(code): tid for tid, code in refs.items()}
    task_shingles = [(t.id, shingles(t.prompt)) for t in tasks]
    rep = SplitReport(rows_in=len(rows), heldout_tasks=len(tasks), references=len(refs))
    kept = []
    for i, row in enumerate(rows):
        prompt, response = _row_text(row)
        hit = answer_hashes.get(code_hash(code_in_response(response, tags)))
        if hit is not None:
            rep.dropped.append({"row": i, "source": row.get("source"), "reason": SAME_CODE,
                                "task": hit})
            continue
        sh = shingles(prompt)
        sim, tid = max(((jaccard(sh, ts), t) for t, ts in task_shingles), default=(0.0, None))
        if sim >= PROMPT_NEAR_DUP:
            rep.dropped.append({"row": i, "source": row.get("source"), "reason": NEAR_DUPLICATE_PROMPT,
                                "task": tid, "similarity": round(sim, 4)})
            continue
        rep.max_prompt_similarity = max(rep.max_prompt_similarity, sim)
        kept.append(row)
    rep.kept = len(kept)
    return kept, rep


def split_training_data(mixed: Path, out: Path, bench: str | None, split: str, bench_out: Path,
                        report_out: Path) -> SplitReport:
    """Write the held-out bench (tasks + reference answers) and the decontaminated train.jsonl."""
    tasks, refs = heldout_tasks(bench, split)
    rows = [obj for _, obj in read_objects(mixed) if not isinstance(obj, BadLine)]
    kept, rep = decontaminate(rows, tasks, refs)
    bench_out.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(bench_out, [t.model_dump() for t in tasks])
    write_jsonl(bench_out.with_name(f"{bench_out.stem}_reference.jsonl"),
                [{"id": tid, "answer": code} for tid, code in refs.items()])
    write_jsonl(out, kept)
    write_json(report_out, rep.to_json())
    return rep
