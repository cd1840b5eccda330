"""`mens eval-local RUN|MODEL_DIR --bench B`: generate answers to a bench, check them, write the report.

The tuned model is evaluated in each requested decoding mode (greedy, parse-and-retry, constrained);
with `--compare-base` the base model answers the same tasks (greedy) in the same run. Results go to
`benchmark_results.json` in the run directory (or --output), with the failing outputs listed.

The model answers through `mens.model.hf_engine.HFEngine`, the engine `mens serve` uses: it decodes greedy answers
in batches of up to 64 that answers leave as they end, and keeps them between modes, so
retry starts from them and constrained decoding keeps the ones its constraint would have produced anyway.
Unconstrained answers end once a fenced code block is closed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from mens.errors import UsageError
from mens.evaluate.bench import DEFAULT_BENCH, BenchTask, load_bench
from mens.evaluate.run import RESULTS_SCHEMA, Decoding, failing_outputs, greedy_requests, run_bench
from mens.lang import Language, get_language
from mens.model.engine import Engine
from mens.run_records import BENCHMARK, BenchmarkResults

MODES = {
    "greedy": Decoding(name="greedy"),
    "retry": Decoding(name="retry", retries=2),
    "constrained": Decoding(name="constrained", constrained=True),
}


def select_tasks(tasks: list[BenchTask], split: str, limit: int | None) -> list[BenchTask]:
    if split != "all":
        tasks = [t for t in tasks if t.split == split]
    if not tasks:
        raise UsageError(f"no bench tasks in split {split!r}; use --split all or heldout/dev")
    return tasks[:limit] if limit else tasks


def evaluate_model(engine: Engine, tasks: list[BenchTask], lang: Language, *, modes: list[str], k: int,
                   max_new_tokens: int, base_engine: Engine | None = None,
                   progress: Callable[[str, int, int], None] | None = None) -> dict:
    """Run every mode (and the base model's engine, greedy) and assemble one report."""
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise UsageError(f"unknown decoding mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    reports = {}
    for mode in modes:
        decoding = MODES[mode] if k == 1 else Decoding(**{**MODES[mode].__dict__, "temperature": 0.7})
        reports[mode] = run_bench(engine, tasks, lang, k=k, decoding=decoding, max_new_tokens=max_new_tokens,
                                  progress=(lambda i, n, m=mode: progress(m, i, n)) if progress else None)
    main = reports[modes[0]]
    out = {"schema": RESULTS_SCHEMA, "k": k, "max_new_tokens": max_new_tokens, "main_mode": modes[0],
           "metrics": main["metrics"], "modes": {m: r["metrics"] for m, r in reports.items()},
           "failures": failing_outputs(main), "results": main["results"],
           "results_by_mode": {m: r["results"] for m, r in reports.items() if m != modes[0]}}
    if base_engine is not None:
        base = run_bench(base_engine, tasks, lang, k=1, decoding=MODES["greedy"], max_new_tokens=max_new_tokens,
                         progress=(lambda i, n: progress("base", i, n)) if progress else None)
        attach_base(out, base)
    return out


def attach_base(report: dict, base: dict) -> None:
    """Put the base model's results (a run_bench report, or a saved one) into the tuned report, with the gains."""
    report["base"] = {"metrics": base["metrics"], "results": base["results"],
                      **({"model": base["model"]} if base.get("model") else {})}
    main, b = report["metrics"], base["metrics"]
    main["gain_over_base"] = round(main["nonempty_parse_rate"] - b["nonempty_parse_rate"], 4)
    main["pass_gain_over_base"] = round(main["pass_at_1"] - b["pass_at_1"], 4)


def eval_local(path: str | Path, bench: str | None = None, *, language: str = "vox", k: int = 1,
               modes: list[str] | None = None, compare_base: bool = False, split: str = "heldout",
               limit: int | None = None, max_new_tokens: int = 256, output: str | Path | None = None,
               device: str = "auto", progress=None, known_greedy: dict[str, str] | None = None) -> Path:
    """Evaluate a run or model directory on a bench; returns the path of the written report.

    `known_greedy` (task id -> answer, another model's greedy answers): each one this model is shown to decode
    exactly (`HFEngine.adopt_greedy`, teacher forcing) is taken as its answer instead of being decoded; the report
    counts them (`greedy_adopted`). Only decoding is skipped: every answer is checked as usual."""
    from mens.model.hf_engine import HFEngine
    from mens.model.inference import load_for_inference, resolve_base

    p = Path(path)
    lang = get_language(language)
    tasks = select_tasks(load_bench(bench), split, limit)
    loaded = load_for_inference(p, device=device)
    base_engine = None
    if compare_base:
        if loaded.kind != "run":
            raise UsageError(f"--compare-base needs a run directory (base + adapter); {p} is a model directory")
        base_dir, _ = resolve_base(p)
        base_loaded = load_for_inference(base_dir, device=device)
        base_loaded.system_prompt = loaded.system_prompt  # the same prompt: the comparison is about the weights
        base_engine = HFEngine(base_loaded, lang)
    engine = HFEngine(loaded, lang)
    adopted = None
    if known_greedy:
        known = [t for t in tasks if t.id in known_greedy]
        adopted = sum(engine.adopt_greedy(greedy_requests(known, max_new_tokens), [known_greedy[t.id] for t in known]))
    report = evaluate_model(engine, tasks, lang, modes=modes or ["greedy"], k=k,
                            max_new_tokens=max_new_tokens, base_engine=base_engine, progress=progress)
    report.update({"model": str(p), "bench": str(bench or DEFAULT_BENCH), "split": split, "language": language})
    if adopted is not None:
        report["greedy_adopted"] = adopted
    out = Path(output) if output else (p / BENCHMARK if p.is_dir() else Path(BENCHMARK))
    BenchmarkResults.parse(report, out).write(out)
    return out
