"""Run a bench: k samples per task, check each, aggregate parse rates, pass@k, coverage, failures.

The model is behind `Generate` (messages -> text), so the runner is the same for a run directory, a
merged model, a served model or a test double. Decoding modes are reported side by side: plain greedy,
parse-and-retry (resample when the answer does not parse or is empty, bounded), and constrained.

With a `GenerateBatch` as well, the first (greedy) answer of every task is drawn in one batched call up front;
only the sampled retries go one at a time.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from mens.evaluate.bench import BenchTask
from mens.evaluate.passk import pass_at_k
from mens.lang import Language
from mens.lang.checks import SampleCheck, check_output

RESULTS_SCHEMA = "mens_benchmark_results_v1"
MAX_OUTPUT_CHARS_KEPT = 4000


@dataclass
class Decoding:
    """How answers are drawn. temperature 0 = greedy; retries > 0 = parse-and-retry."""

    name: str = "greedy"
    temperature: float = 0.0
    constrained: bool = False
    retries: int = 0
    retry_temperature: float = 0.7


# (messages, max_new_tokens, temperature, seed, constrained) -> answer text
Generate = Callable[[list[dict[str, str]], int, float, int, bool], str]
# (chats, max_new_tokens, constrained, progress(finished, total) or None) -> greedy answer texts, in order.
# Must give what `Generate` gives at temperature 0 for each chat.
GenerateBatch = Callable[[list[list[dict[str, str]]], int, bool, Callable[[int, int], None] | None], list[str]]


def _messages(task: BenchTask) -> list[dict[str, str]]:
    return [{"role": "user", "content": task.prompt}]


def _sample(generate: Generate, task: BenchTask, lang: Language, decoding: Decoding, seed: int,
            max_new_tokens: int, first: str | None = None) -> tuple[str, SampleCheck, int]:
    """One sample with its retries; `first` is the first answer when it was already drawn (batched)."""
    messages = _messages(task)
    if first is None:
        first = generate(messages, max_new_tokens, decoding.temperature, seed, decoding.constrained)
    output = first
    check = check_output(output, task.expect, lang)
    attempts = 1
    while attempts <= decoding.retries and not check.has_code:
        output = generate(messages, max_new_tokens, decoding.retry_temperature, seed + 7919 * attempts,
                          decoding.constrained)
        check = check_output(output, task.expect, lang)
        attempts += 1
    return output, check, attempts


def _retry_in_batches(sample, tasks: list[BenchTask], lang: Language, decoding: Decoding, max_new_tokens: int,
                      draws: list[list[list]], seeds: list[list[int]]) -> None:
    """Parse-and-retry with every unparsed answer of a round resampled in one batch; the same seeds and attempt
    numbering as `_sample`, so the answers are those the one-at-a-time path would give."""
    for attempt in range(1, decoding.retries + 1):
        todo = [(i, s) for i, row in enumerate(draws) for s, d in enumerate(row) if not d[1].has_code]
        if not todo:
            return
        outs = sample([_messages(tasks[i]) for i, _ in todo], max_new_tokens, decoding.retry_temperature,
                      [seeds[i][s] + 7919 * attempt for i, s in todo])
        for (i, s), output in zip(todo, outs, strict=True):
            draws[i][s] = [output, check_output(output, tasks[i].expect, lang), attempt + 1]


def run_bench(generate: Generate, tasks: list[BenchTask], lang: Language, *, k: int = 1,
              decoding: Decoding | None = None, seed_base: int = 0, max_new_tokens: int = 256,
              progress: Callable[[int, int], None] | None = None, generate_batch: GenerateBatch | None = None
              ) -> dict:
    """Evaluate every task with k samples (seed = seed_base + 1000*task_index + sample).

    With `generate_batch` and greedy decoding the first answers come from one batched call (once per task:
    greedy samples are all alike), and when it offers `.sample` the unconstrained retries are batched too;
    `progress` then runs twice, while they decode and while they are checked.
    """
    decoding = decoding or Decoding()
    results, started = [], time.perf_counter()
    batched = generate_batch is not None and decoding.temperature <= 0
    seeds = [[seed_base + 1000 * i + s for s in range(k)] for i in range(len(tasks))]
    firsts: list[str | None] = [None] * len(tasks)
    if batched:
        firsts = list(generate_batch([_messages(t) for t in tasks], max_new_tokens, decoding.constrained, progress))
    sample = getattr(generate_batch, "sample", None) if batched and not decoding.constrained else None
    if sample is not None and decoding.retries:
        draws = [[[firsts[i], check_output(firsts[i], t.expect, lang), 1] for _ in range(k)]
                 for i, t in enumerate(tasks)]
        _retry_in_batches(sample, tasks, lang, decoding, max_new_tokens, draws, seeds)
    else:
        draws = []
        for i, t in enumerate(tasks):  # one at a time (sampled modes, or no batch generator): report as we go
            draws.append([list(_sample(generate, t, lang, decoding, seeds[i][s], max_new_tokens, firsts[i]))
                          for s in range(k)])
            if progress and not batched:
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
