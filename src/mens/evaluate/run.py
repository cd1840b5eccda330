"""Run a bench: k samples per task, check each, aggregate parse rates, pass@k, coverage, failures.

The model is behind an `Engine` (`mens.model.engine`), so the runner is the same for a run directory, a merged
model or a test double. Decoding modes are reported side by side: plain greedy, parse-and-retry (resample when the
answer does not parse or is empty, bounded), and constrained.

Every answer is asked for with `Engine.generate_batch`, which gives what streaming each request would, so the
engine may batch: with greedy decoding the first answers of all tasks go in one call, then each round of retries
in one call; sampled decoding asks for one sample (and its retries) at a time, reporting progress per task.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from mens.errors import UsageError
from mens.evaluate.bench import BenchTask
from mens.evaluate.passk import pass_at_k
from mens.lang import Language
from mens.lang.checks import check_output
from mens.model.engine import Engine, GenerationRequest
from mens.run_records import BenchmarkResults

RESULTS_SCHEMA = BenchmarkResults.SCHEMA
MAX_OUTPUT_CHARS_KEPT = 4000
RETRY_SEED_STEP = 7919
"""Attempt a of a sample with seed s draws with seed s + RETRY_SEED_STEP * a (a prime: no clash across samples)."""


@dataclass
class Decoding:
    """How answers are drawn. temperature 0 = greedy; retries > 0 = parse-and-retry."""

    name: str = "greedy"
    temperature: float = 0.0
    constrained: bool = False
    retries: int = 0
    retry_temperature: float = 0.7


def _request(task: BenchTask, decoding: Decoding, temperature: float, seed: int, max_new_tokens: int
             ) -> GenerationRequest:
    """The request for one answer; the system prompt is the engine's (the one the model was trained with).
    An unconstrained answer ends once its fenced code block is closed: the checker reads that block."""
    return GenerationRequest(messages=[{"role": "user", "content": task.prompt}], max_tokens=max_new_tokens,
                             temperature=temperature, seed=seed, constrained=decoding.constrained,
                             stop_at_closed_block=True)


def greedy_requests(tasks: list[BenchTask], max_new_tokens: int) -> list[GenerationRequest]:
    """The requests `run_bench` makes for greedy answers, one a task (what an engine may adopt answers for)."""
    return [_request(t, Decoding(), 0.0, 0, max_new_tokens) for t in tasks]


def _retry_in_rounds(engine: Engine, tasks: list[BenchTask], lang: Language, decoding: Decoding,
                     max_new_tokens: int, draws: list[list[list]], seeds: list[list[int]]) -> None:
    """Parse-and-retry: every draw ([output, SampleCheck, attempts]) without code is resampled, one round (one
    `generate_batch` call) per attempt a with seed + RETRY_SEED_STEP * a, until it has code or no retry is left."""
    for attempt in range(1, decoding.retries + 1):
        todo = [(i, s) for i, row in enumerate(draws) for s, d in enumerate(row) if not d[1].has_code]
        if not todo:
            return
        outs = engine.generate_batch([_request(tasks[i], decoding, decoding.retry_temperature,
                                               seeds[i][s] + RETRY_SEED_STEP * attempt, max_new_tokens)
                                      for i, s in todo])
        for (i, s), output in zip(todo, outs, strict=True):
            draws[i][s] = [output, check_output(output, tasks[i].expect, lang), attempt + 1]


def check_engine_constrains(engine: Engine, lang: Language) -> None:
    """Constrained decoding needs an engine that constrains to `lang` (else its answers would not be)."""
    if engine.constrained_language != lang.name:
        have = f"constrains {engine.constrained_language}" if engine.constrained_language else "cannot constrain"
        raise UsageError(f"constrained decoding of {lang.name} needs an engine that constrains {lang.name}; "
                         f"engine {engine.model_id!r} {have}")


def run_bench(engine: Engine, tasks: list[BenchTask], lang: Language, *, k: int = 1,
              decoding: Decoding | None = None, seed_base: int = 0, max_new_tokens: int = 256,
              progress: Callable[[int, int], None] | None = None) -> dict:
    """Evaluate every task with k samples (seed = seed_base + 1000*task_index + sample).

    Greedy decoding asks for each task's first answer once (greedy samples are all alike), all tasks in one
    `generate_batch` call; `progress` then runs twice, while they decode and while they are checked.
    """
    decoding = decoding or Decoding()
    if decoding.constrained:
        check_engine_constrains(engine, lang)
    results, started = [], time.perf_counter()
    batched = decoding.temperature <= 0
    seeds = [[seed_base + 1000 * i + s for s in range(k)] for i in range(len(tasks))]
    if batched:
        firsts = engine.generate_batch([_request(t, decoding, decoding.temperature, seeds[i][0], max_new_tokens)
                                        for i, t in enumerate(tasks)], progress)
        draws = [[[firsts[i], check_output(firsts[i], t.expect, lang), 1] for _ in range(k)]
                 for i, t in enumerate(tasks)]
        _retry_in_rounds(engine, tasks, lang, decoding, max_new_tokens, draws, seeds)
    else:
        draws = []
        for i, t in enumerate(tasks):  # sample by sample, retries included, reporting task by task
            row = []
            for seed in seeds[i]:
                [output] = engine.generate_batch([_request(t, decoding, decoding.temperature, seed, max_new_tokens)])
                cell = [[output, check_output(output, t.expect, lang), 1]]
                _retry_in_rounds(engine, [t], lang, decoding, max_new_tokens, [cell], [[seed]])
                row.append(cell[0])
            draws.append(row)
            if progress:
                progress(i + 1, len(tasks))
    for i, task in enumerate(tasks):
        samples = [{"sample_index": s, "seed": seeds[i][s], "attempts": attempts,
                    "output": output[:MAX_OUTPUT_CHARS_KEPT], **check.to_json()}
                   for s, (output, check, attempts) in enumerate(draws[i])]
        c = sum(x["pass"] for x in samples)
        results.append({"id": task.id, "category": task.category, "split": task.split, "prompt": task.prompt,
                        "pass_at_1": pass_at_k(k, c, 1), "pass_at_k": pass_at_k(k, c, k), "samples": samples})
        if progress and batched:
            progress(i + 1, len(tasks))
    metrics = summarize(results, tasks, lang)
    metrics["seconds"] = round(time.perf_counter() - started, 2)
    metrics["batched"] = batched
    return {"decoding": decoding.__dict__, "k": k, "seed_base": seed_base, "max_new_tokens": max_new_tokens,
            "metrics": metrics, "results": results}


def _expected_kinds(tasks: list[BenchTask], lang: Language) -> set[str]:
    kinds = set()
    for t in tasks:
        kinds.update(lang.base_kind(k) for k in t.expect.kinds)
        kinds.update(lang.base_kind(k) for k, _ in t.expect.decls)
    return kinds


def summarize(results: list[dict], tasks: list[BenchTask], lang: Language) -> dict:
    """Aggregate metrics over all samples and tasks, overall and per category."""
    samples = [s for r in results for s in r["samples"]]
    n = max(1, len(samples))
    seen = {lang.base_kind(k) for s in samples if s["parse_ok"] for k, _ in s["decls"]}
    expected = _expected_kinds(tasks, lang)
    fail_counts = Counter(s["failures"][0]["category"] for s in samples if s["failures"])
    per_cat: dict[str, dict] = defaultdict(lambda: {"tasks": 0, "pass_at_1": 0.0, "nonempty_parse": 0, "samples": 0})
    for r in results:
        cat = per_cat[r["category"]]
        cat["tasks"] += 1
        cat["pass_at_1"] += r["pass_at_1"]
        cat["samples"] += len(r["samples"])
        cat["nonempty_parse"] += sum(s["has_code"] for s in r["samples"])
    categories = {name: {"tasks": c["tasks"], "pass_at_1": round(c["pass_at_1"] / c["tasks"], 4),
                         "nonempty_parse_rate": round(c["nonempty_parse"] / max(1, c["samples"]), 4)}
                  for name, c in sorted(per_cat.items())}
    n_tasks = max(1, len(results))
    return {
        "tasks": len(results),
        "samples": len(samples),
        "parse_rate": round(sum(s["parse_ok"] and s["non_empty"] for s in samples) / n, 4),
        "nonempty_parse_rate": round(sum(s["has_code"] for s in samples) / n, 4),
        "pass_at_1": round(sum(r["pass_at_1"] for r in results) / n_tasks, 4),
        "pass_at_k": round(sum(r["pass_at_k"] for r in results) / n_tasks, 4),
        "coverage": round(len(seen & expected) / len(expected), 4) if expected else 0.0,
        "kinds_expected": sorted(expected),
        "kinds_seen": sorted(seen),
        "failures_by_category": dict(fail_counts.most_common()),
        "per_category": categories,
    }


def failing_outputs(report: dict, limit: int = 50) -> list[dict]:
    """The first failing sample of each failed task, with its reason and first diagnostic."""
    rows = []
    for r in report["results"]:
        bad = next((s for s in r["samples"] if not s["pass"]), None)
        if bad is not None and r["pass_at_k"] < 1.0:
            rows.append({"id": r["id"], "category": r["category"], "reason": bad["failures"][0]["reason"],
                         "failure": bad["failures"][0]["category"], "first_diagnostic": bad["first_diagnostic"],
                         "output": bad["output"][:600]})
    return rows[:limit]
