"""`mens eval-local RUN|MODEL_DIR --bench B`: generate answers to a bench, check them, write the report.

The tuned model is evaluated in each requested decoding mode (greedy, parse-and-retry, constrained);
with `--compare-base` the base model answers the same tasks (greedy) in the same run. Results go to
`benchmark_results.json` in the run directory (or --output), with the failing outputs listed.

Greedy answers are decoded in batches (on CPU a step for 16 answers costs about as much as a step for one)
and shared between modes: retry starts from them, and constrained decoding keeps the ones its constraint
would have produced anyway. Unconstrained answers end once a fenced code block is closed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from mens.errors import UsageError
from mens.evaluate.bench import DEFAULT_BENCH, BenchTask, load_bench
from mens.evaluate.run import RESULTS_SCHEMA, Decoding, Generate, GenerateBatch, failing_outputs, run_bench
from mens.lang import Language, get_language

MODES = {
    "greedy": Decoding(name="greedy"),
    "retry": Decoding(name="retry", retries=2),
    "constrained": Decoding(name="constrained", constrained=True),
}


def generate_fn(loaded, lang: Language) -> Generate:
    """A Generate callable over a loaded model (chat template and system prompt as in training)."""
    from mens.model.constraint import language_constraint
    from mens.model.generate import chat_input_ids, code_block_closed, stream_tokens

    def generate(messages, max_new_tokens, temperature, seed, constrained) -> str:
        ids = chat_input_ids(loaded.tokenizer, messages, loaded.system_prompt)
        constraint = language_constraint(lang) if constrained else None
        return "".join(stream_tokens(loaded.model, loaded.tokenizer, ids, max_new_tokens=max_new_tokens,
                                     temperature=temperature, seed=seed, constraint=constraint,
                                     stop_text=None if constrained else code_block_closed))

    return generate


def generate_batch_fn(loaded, lang: Language, *, batch_size: int = 16) -> GenerateBatch:
    """A GenerateBatch over a loaded model: greedy answers in batches, the same as `generate_fn` at temperature 0.

    Answers are kept per (prompt, budget), so later modes reuse them. Constrained: a greedy answer that ended
    at a stop token and that the constraint accepts at every step is exactly what constrained decoding would
    produce; the other tasks are decoded with the constraint one at a time.
    """
    from mens.model.constraint import language_constraint
    from mens.model.generate import (
        BatchOutput,
        chat_input_ids,
        code_block_closed,
        constraint_accepts,
        generate_greedy_batch,
    )

    single = generate_fn(loaded, lang)
    answers: dict[tuple[tuple[int, ...], int], BatchOutput] = {}  # keyed by (prompt ids, max_new_tokens)

    def decode_missing(prompts: list[tuple[int, ...]], max_new_tokens: int, progress) -> None:
        missing = list(dict.fromkeys(p for p in prompts if (p, max_new_tokens) not in answers))
        done = len(prompts) - len(missing)
        report = (lambda i, n: progress(done + i, len(prompts))) if progress else None
        outs = generate_greedy_batch(loaded.model, loaded.tokenizer, [list(p) for p in missing],
                                     max_new_tokens=max_new_tokens, batch_size=batch_size,
                                     stop_text=code_block_closed, progress=report)
        answers.update({(p, max_new_tokens): out for p, out in zip(missing, outs, strict=True)})
        if progress and not missing:
            progress(len(prompts), len(prompts))

    def generate_batch(chats, max_new_tokens, constrained, progress=None) -> list[str]:
        prompts = [tuple(chat_input_ids(loaded.tokenizer, m, loaded.system_prompt)) for m in chats]
        decode_missing(prompts, max_new_tokens, progress)
        outs = [answers[(p, max_new_tokens)] for p in prompts]
        if not constrained:
            return [out.text for out in outs]
        constraint = language_constraint(lang)
        return [out.text if out.finish == "stop" and constraint_accepts(loaded.tokenizer, out.token_ids, constraint)
                else single(chat, max_new_tokens, 0.0, 0, True) for chat, out in zip(chats, outs, strict=True)]

    def sample(chats, max_new_tokens, temperature, seeds) -> list[str]:
        """Seeded sampled answers (parse-and-retry's further attempts), batched; equal to `generate_fn`'s."""
        prompts = [chat_input_ids(loaded.tokenizer, m, loaded.system_prompt) for m in chats]
        outs = generate_greedy_batch(loaded.model, loaded.tokenizer, prompts, max_new_tokens=max_new_tokens,
                                     batch_size=batch_size, stop_text=code_block_closed, temperature=temperature,
                                     seeds=seeds)
        return [out.text for out in outs]

    generate_batch.sample = sample  # run_bench batches unconstrained retries through it
    return generate_batch


def select_tasks(tasks: list[BenchTask], split: str, limit: int | None) -> list[BenchTask]:
    if split != "all":
        tasks = [t for t in tasks if t.split == split]
    if not tasks:
        raise UsageError(f"no bench tasks in split {split!r}; use --split all or heldout/dev")
    return tasks[:limit] if limit else tasks


def evaluate_model(generate: Generate, tasks: list[BenchTask], lang: Language, *, modes: list[str], k: int,
                   max_new_tokens: int, base_generate: Generate | None = None,
                   progress: Callable[[str, int, int], None] | None = None, generate_batch: GenerateBatch | None = None,
                   base_generate_batch: GenerateBatch | None = None) -> dict:
    """Run every mode (and the base model, greedy) and assemble one report; greedy modes batch when they can."""
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise UsageError(f"unknown decoding mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    reports = {}
    for mode in modes:
        decoding = MODES[mode] if k == 1 else Decoding(**{**MODES[mode].__dict__, "temperature": 0.7})
        reports[mode] = run_bench(generate, tasks, lang, k=k, decoding=decoding, max_new_tokens=max_new_tokens,
                                  progress=(lambda i, n, m=mode: progress(m, i, n)) if progress else None,
                                  generate_batch=generate_batch)
    main = reports[modes[0]]
    out = {"schema": RESULTS_SCHEMA, "k": k, "max_new_tokens": max_new_tokens, "main_mode": modes[0],
           "metrics": main["metrics"], "modes": {m: r["metrics"] for m, r in reports.items()},
           "failures": failing_outputs(main), "results": main["results"],
           "results_by_mode": {m: r["results"] for m, r in reports.items() if m != modes[0]}}
    if base_generate is not None:
        base = run_bench(base_generate, tasks, lang, k=1, decoding=MODES["greedy"], max_new_tokens=max_new_tokens,
                         progress=(lambda i, n: progress("base", i, n)) if progress else None,
                         generate_batch=base_generate_batch)
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
               device: str = "auto", progress=None) -> Path:
    """Evaluate a run or model directory on a bench; returns the path of the written report."""
    from mens.model.inference import load_for_inference, resolve_base

    p = Path(path)
    lang = get_language(language)
    tasks = select_tasks(load_bench(bench), split, limit)
    loaded = load_for_inference(p, device=device)
    base_generate = base_generate_batch = None
    if compare_base:
        if loaded.kind != "run":
            raise UsageError(f"--compare-base needs a run directory (base + adapter); {p} is a model directory")
        base_dir, _ = resolve_base(p)
        base_loaded = load_for_inference(base_dir, device=device)
        base_loaded.system_prompt = loaded.system_prompt  # the same prompt: the comparison is about the weights
        base_generate, base_generate_batch = generate_fn(base_loaded, lang), generate_batch_fn(base_loaded, lang)
    report = evaluate_model(generate_fn(loaded, lang), tasks, lang, modes=modes or ["greedy"], k=k,
                            max_new_tokens=max_new_tokens, base_generate=base_generate, progress=progress,
                            generate_batch=generate_batch_fn(loaded, lang), base_generate_batch=base_generate_batch)
    report.update({"model": str(p), "bench": str(bench or DEFAULT_BENCH), "split": split, "language": language})
    out = Path(output) if output else (p / "benchmark_results.json" if p.is_dir() else Path("benchmark_results.json"))
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return out
