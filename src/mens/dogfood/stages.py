"""The stages of `mens dogfood`, one function each: `stage(ctx) -> one-line note`.

Each reads what earlier stages wrote under the output directory and writes its own files (layout below);
heavy libraries are imported inside the stages that need them.

    corpus/units.jsonl validated.jsonl rejects.jsonl pairs.jsonl synthetic.jsonl tasks.jsonl bench_dev.jsonl
    requests.jsonl repairs.jsonl mix.yaml mixed.jsonl
    data/train.jsonl heldout_split.json eval_results.json    bench/heldout.jsonl heldout_reference.jsonl
    eval/base_results.json merged_results.json    run/ (mens train + benchmark_results.json, gate_receipt.json,
    merge_parity.json, README.md, report.html, plots/)    merged/ (mens merge, with the same README.md)
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import yaml

from mens.dogfood.pipeline import Context
from mens.errors import GateFailed
from mens.run_records import (
    BENCHMARK,
    BUDGET,
    DOGFOOD_STATE,
    HELDOUT_SPLIT,
    MERGE_PARITY,
    BenchmarkResults,
    MergeParity,
    read_json,
    write_json,
)

LANGUAGE = "vox"
DEV_REPEATS = 4.0
"""How often each dev-split pair repeats in the mix: 116 hand-written answers among ~2,100 rows. Measured against
two, three and five copies: docs/benchmarks.md ("The dev split twice", "The dev split four times")."""
DEV_RENAMED = "bench_dev_renamed.jsonl"
"""The dev split's renamed repeats (DogfoodConfig.renamed_dev)."""
REQUEST_REPEATS = 1.0
"""How often each hand-written request (mens.corpus.requests) repeats in the mix."""


def extract(ctx: Context) -> str:
    from mens.corpus.extract import embedded_root, extract_to_file

    out = ctx.path("corpus", "units.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)  # extract appends: start clean so a rerun gives the same file
    missing = [str(p) for p in ctx.cfg.corpus if not Path(p).exists()]
    if missing:
        from mens.errors import UsageError

        raise UsageError(f"--corpus {', '.join(missing)}: no such file or directory")
    rep = extract_to_file([embedded_root(LANGUAGE), *map(Path, ctx.cfg.corpus)], out, LANGUAGE)
    return f"{rep.units_new} units"


def validate(ctx: Context) -> str:
    from mens.corpus.validate import validate_file

    c = ctx.path("corpus")
    rep = validate_file(c / "units.jsonl", c / "validated.jsonl", c / "rejects.jsonl", recheck=True,
                        language=LANGUAGE)
    (c / "validate_report.json").write_text(json.dumps(rep.to_json(), indent=2) + "\n", encoding="utf-8")
    return f"kept {rep.n_kept} of {rep.n_in} (rejected {sum(rep.rejected.values())}, reasons in rejects.jsonl)"


def pairs(ctx: Context) -> str:
    from mens.corpus.pairs import build_pairs

    c = ctx.path("corpus")
    rep = build_pairs(c / "validated.jsonl", c / "pairs.jsonl", [], ctx.cfg.seed, 3, False,
                      c / "pairs_rejects.jsonl", LANGUAGE)
    return f"{rep.n_pairs} pairs from {rep.n_used} units"


def generate(ctx: Context) -> str:
    """Synthetic programs (construct variety) and task-shaped pairs (a request that names the kind, name and
    signature, and an answer checked against exactly that), both parse-checked before they are written."""
    from mens.corpus.generate import generate_to_file
    from mens.corpus.jsonl import write_jsonl
    from mens.corpus.taskgen import generate_tasks_to_file
    from mens.evaluate.bench import heldout_names

    parts = []  # --synthetic 0 / --tasks 0 leave that source out of the mix
    if ctx.cfg.synthetic:
        rep = generate_to_file(ctx.path("corpus", "synthetic.jsonl"), ctx.cfg.synthetic, ctx.cfg.seed, LANGUAGE)
        parts.append(f"{rep.written} synthetic programs ({len(rep.kinds)} construct kinds)")
    if ctx.cfg.tasks:
        tasks = generate_tasks_to_file(ctx.path("corpus", "tasks.jsonl"), ctx.cfg.tasks, ctx.cfg.seed,
                                       avoid_names=heldout_names(ctx.cfg.bench))
        parts.append(f"{tasks.written} task pairs ({len(tasks.categories)} categories)")
    note = (" and ".join(parts) + "; all parse and pass their own checks") if parts else "no synthetic data"
    if ctx.cfg.dev_pairs:
        from mens.dogfood.heldout import dev_pairs

        dev = dev_pairs(ctx.cfg.bench, LANGUAGE)
        write_jsonl(ctx.path("corpus", "bench_dev.jsonl"), dev)
        note += f"; {len(dev)} dev-split tasks with their reference answers"
        if ctx.cfg.renamed_dev:
            from mens.corpus.rename import renamed_copies
            from mens.lang import get_language

            copies, n = renamed_copies(dev, _dev_copies(), ctx.cfg.seed, get_language(LANGUAGE))
            write_jsonl(ctx.path("corpus", DEV_RENAMED), copies)
            note += f" ({n} of their {len(copies)} repeats renamed)"
    if ctx.cfg.requests or ctx.cfg.repairs:
        from mens.corpus.requests import request_pairs

        reqs = request_pairs(LANGUAGE)  # loaded, every answer checked, once for both
    if ctx.cfg.requests:
        write_jsonl(ctx.path("corpus", "requests.jsonl"), reqs)
        note += f"; {len(reqs)} hand-written requests, each answer checked"
    if ctx.cfg.repairs:
        from mens.corpus.repairs import repair_pairs
        from mens.lang import get_language

        rows, rep = repair_pairs(reqs, ctx.cfg.repairs, ctx.cfg.seed, get_language(LANGUAGE))
        write_jsonl(ctx.path("corpus", "repairs.jsonl"), rows)
        note += f"; {rep.written} repair pairs ({len(rep.by_edit)} kinds of edit, each rejected by the parser)"
    return note


def _dev_copies() -> int:
    """The dev split's repeats after the first."""
    return max(0, math.ceil(DEV_REPEATS) - 1)


def _dev_sources(renamed: bool) -> list[dict]:
    """The dev split's mix sources: DEV_REPEATS copies of each pair, all but the first renamed when `renamed`."""
    if not renamed:
        return [{"path": "bench_dev.jsonl", "weight": DEV_REPEATS}]
    return [{"path": "bench_dev.jsonl", "weight": 1.0}, {"path": DEV_RENAMED, "weight": 1.0}]


def mix(ctx: Context) -> str:
    from mens.corpus.mix import mix_sources

    c = ctx.path("corpus")
    config = {"version": 1, "output": "mixed.jsonl", "seed": ctx.cfg.seed,
              "sources": [{"path": "pairs.jsonl", "weight": 1.0},
                          *([{"path": "synthetic.jsonl", "weight": 1.0}] if ctx.cfg.synthetic else []),
                          *([{"path": "tasks.jsonl", "weight": 1.0}] if ctx.cfg.tasks else []),
                          *(_dev_sources(ctx.cfg.renamed_dev) if ctx.cfg.dev_pairs else []),
                          *([{"path": "requests.jsonl", "weight": REQUEST_REPEATS}] if ctx.cfg.requests else []),
                          *([{"path": "repairs.jsonl", "weight": 1.0}] if ctx.cfg.repairs else [])]}
    (c / "mix.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    rep = mix_sources(c / "mix.yaml", base=c)
    return f"{rep['total_emitted']} rows from {len(rep['sources'])} sources"


def heldout(ctx: Context) -> str:
    from mens.corpus.eval import eval_to_file
    from mens.dogfood.heldout import split_training_data

    data = ctx.path("data")
    data.mkdir(parents=True, exist_ok=True)
    rep = split_training_data(ctx.path("corpus", "mixed.jsonl"), data / "train.jsonl", ctx.cfg.bench, ctx.cfg.split,
                              ctx.path("bench", "heldout.jsonl"), data / HELDOUT_SPLIT)
    stats = eval_to_file(data / "train.jsonl", data / "eval_results.json", None, LANGUAGE)
    return (f"{rep.heldout_tasks} held-out tasks; training rows {rep.kept} (dropped {len(rep.dropped)} overlapping); "
            f"training data parse rate {stats['parse_rate']:.2%}")


def _bench_tasks(ctx: Context):
    from mens.evaluate.bench import load_bench

    tasks = load_bench(ctx.path("bench", "heldout.jsonl"))
    return tasks[: ctx.cfg.limit] if ctx.cfg.limit else tasks


def _progress(ctx: Context, label: str):
    state = {"last": 0.0}

    def progress(mode: str, i: int, n: int) -> None:
        import time

        if time.time() - state["last"] >= 10 or i == n:
            state["last"] = time.time()
            ctx.log(f"    {label} {mode}: {i}/{n} tasks")

    return progress


def eval_base(ctx: Context) -> str:
    """The base model answers the held-out tasks (greedy) with the same system prompt the tuned model gets."""
    from mens.evaluate.local import evaluate_model
    from mens.lang import get_language
    from mens.model.hf_engine import HFEngine
    from mens.model.inference import load_for_inference
    from mens.model.load import resolve_model

    lang = get_language(LANGUAGE)
    base_dir, _ = resolve_model(ctx.cfg.model)
    loaded = load_for_inference(base_dir, device=ctx.cfg.device)
    loaded.system_prompt = ctx.cfg.system_prompt or None
    tasks = _bench_tasks(ctx)
    report = evaluate_model(HFEngine(loaded, lang), tasks, lang, modes=["greedy"], k=1,
                            max_new_tokens=ctx.cfg.max_new_tokens, progress=_progress(ctx, "base"))
    report.update({"model": str(base_dir), "bench": str(ctx.path("bench", "heldout.jsonl")), "split": "heldout",
                   "language": LANGUAGE, "system_prompt": loaded.system_prompt})
    out = ctx.path("eval", "base_results.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    BenchmarkResults.parse(report, out).write(out)
    m = report["metrics"]
    return f"base: non-empty parse rate {m['nonempty_parse_rate']:.3f}, pass@1 {m['pass_at_1']:.3f}"


def train_config(ctx: Context, *, data: str = "data", run: str = "run", init_adapter: Path | None = None):
    """The TrainConfig of a round: the device's preset (or the `train:` block's), --quick's and the user's training
    overrides, then what dogfood sets itself (data, run directory, model, device, seed, system prompt)."""
    from mens.train.resolve import resolve_config

    cfg = ctx.cfg
    own = {"data": str(ctx.path(data)), "output_dir": str(ctx.path(run)), "model": cfg.model, "device": cfg.device,
           "seed": cfg.seed, "system_prompt": cfg.system_prompt, "resume": cfg.resume or None,
           "init_adapter": None if init_adapter is None else str(init_adapter),
           "extra": {"dogfood": str(cfg.output_dir)}}
    return resolve_config(overrides=cfg.train_overrides(), flags=own)


def train(ctx: Context, **round_kw) -> str:
    from mens.dogfood.budget import RUN_VAL_SHARE, parse_budget
    from mens.train.run import run_training

    tc = train_config(ctx, **round_kw)
    budget_note, plan, recipe_eval_every = "", None, tc.eval_every
    if (budget_s := parse_budget(ctx.cfg.budget)) is not None:
        plan = _budget_plan(ctx, tc, budget_s)
        tc.max_steps = plan["steps"]
        tc.max_time_s = plan.get("max_time_s") or 0.0  # the budget holds on a machine that slows down mid-run
        # The probe's few steps read a step time 8-19% off the run's own mean on a shared 2-core VM (either way:
        # docs/benchmarks.md), so the run re-fits its length to the time limit as it goes (never past the
        # recipe's), and validates once, at whatever step it ends, on a share of the rows (budget.RUN_VAL_SHARE).
        tc.fit_to_time, tc.eval_every = True, 0
        tc.fit_max_steps = plan.get("recipe_steps") or 0  # a --max-steps the user gave is the recipe's length
        note = plan["note"]
        budget_note = f"; budget {ctx.cfg.budget}: {note}"
        ctx.log(f"    budget {ctx.cfg.budget}: {note}")
    ctx.log(f"    preset {tc.preset}, backend {tc.backend}, device {tc.device}, "
            f"{'max_steps ' + str(tc.max_steps) if tc.max_steps else 'epochs ' + str(tc.epochs)}")
    s = run_training(tc, val_share=RUN_VAL_SHARE if plan is not None else 1.0)
    val_rows = "" if plan is None else f" (every {round(1 / RUN_VAL_SHARE)}th validation row)"
    if plan is not None:
        _estimate_whole_recipe(ctx, plan, Path(tc.output_dir), recipe_eval_every)
    if s.get("stopped_early"):
        budget_note += f"; stopped at step {s['steps']} by the time limit ({tc.max_time_s:.0f} s of training)"
    elif budget_note and s["steps"] != tc.max_steps:
        budget_note += (f"; re-fitted to {s['steps']} steps by the run's own step time "
                        f"({s['tokens_per_s']} tokens/s)")
    return (f"{s['steps']} steps, loss {s['first_loss']:.3f} -> {s['final_loss']:.3f}, "
            f"val loss {s['val_loss'] if s['val_loss'] is None else round(s['val_loss'], 3)}{val_rows}, "
            f"{s['tokens_per_s']} tokens/s{budget_note}")


def _estimate_whole_recipe(ctx: Context, plan: dict, run_dir: Path, eval_every: int | str) -> None:
    """Add to data/budget.json how long the recipe's whole length would train here, from the run's own mean step
    time: the summary tells a user whose budget cut the recipe what `--budget none` costs on this machine."""
    from mens.dogfood.budget import mean_step_s, whole_recipe_train_s
    from mens.train.telemetry import read_events

    step_s = mean_step_s([e["elapsed_s"] for e in read_events(run_dir) if e.get("event") == "step"])
    if step_s is None or not plan.get("probe"):
        return
    plan["whole_recipe"] = {"step_s": round(step_s, 3), "eval_every": eval_every,
                            "train_s": round(whole_recipe_train_s(plan["probe"], step_s, eval_every), 1)}
    write_json(ctx.path("data", BUDGET), plan)  # atomic: a resumed run reads this plan back


def _budget_plan(ctx: Context, tc, budget_s: float) -> dict:
    """The training length that fits the budget (data/budget.json). Made once: a resumed run keeps its plan, so
    it trains the steps its checkpoints were planned for."""
    import time
    from dataclasses import asdict

    from mens.dogfood.budget import cpu_name, plan_budget, probe_training, since_launch, write_plan
    from mens.train.run import cpu_has_native_bf16

    path = ctx.path("data", BUDGET)
    if path.is_file():
        return read_json(path)
    stages = read_json(ctx.path(DOGFOOD_STATE)).get("stages", {})
    t0 = time.time()
    probe = probe_training(tc, ctx.path("budget_probe"))
    elapsed = sum(v.get("seconds") or 0 for v in stages.values()) + (time.time() - t0)
    # The whole command's time where the launcher gave its start (set-up included); on a resumed run the stages of
    # earlier commands are the larger number.
    elapsed = max(elapsed, since_launch(time.time(), os.environ) or 0.0)
    plan = plan_budget(budget_s, elapsed, (stages.get("eval-base") or {}).get("seconds") or 0.0, probe,
                       cpu=cpu_name(), native_bf16=cpu_has_native_bf16())
    write_plan(plan, path)
    return asdict(plan)


def eval_tuned(ctx: Context, run: str = "run") -> str:
    """The tuned run answers the same tasks in every mode; the base results are attached for comparison."""
    from mens.evaluate.local import attach_base, eval_local

    out = eval_local(ctx.path(run), str(ctx.path("bench", "heldout.jsonl")), language=LANGUAGE, k=1,
                     modes=list(ctx.cfg.modes), split="all", limit=ctx.cfg.limit,
                     max_new_tokens=ctx.cfg.max_new_tokens, device=ctx.cfg.device, progress=_progress(ctx, "tuned"))
    report = BenchmarkResults.read(out).to_json()
    attach_base(report, BenchmarkResults.read(ctx.path("eval", "base_results.json")).to_json())
    BenchmarkResults.parse(report, out).write(out)
    return "; ".join(f"{mode}: parse {m['nonempty_parse_rate']:.3f}, pass@1 {m['pass_at_1']:.3f}"
                     for mode, m in report["modes"].items()) + \
        f"; gain over base {report['metrics']['gain_over_base']:+.3f}"


def focus(ctx: Context) -> str:
    """Round 2's data: the round-1 model answers the bench's dev split (never the held-out one); task pairs are
    generated with more weight on the categories it failed, checked, decontaminated, and mixed with an equal
    replay of round-1 rows so that what was learned is kept."""
    import random

    from mens.corpus.jsonl import read_objects, write_jsonl
    from mens.corpus.records import BadLine
    from mens.corpus.taskgen import focus_from_results, generate_task_pairs
    from mens.dogfood.heldout import decontaminate, heldout_tasks
    from mens.evaluate.bench import heldout_names
    from mens.evaluate.local import eval_local

    dev_out = eval_local(ctx.run_dir1, ctx.cfg.bench, language=LANGUAGE, modes=["greedy"], split="dev",
                         limit=ctx.cfg.limit, max_new_tokens=ctx.cfg.max_new_tokens,
                         output=ctx.path("eval", "dev_results.json"), device=ctx.cfg.device,
                         progress=_progress(ctx, "dev"))
    dev = BenchmarkResults.read(dev_out).to_json()
    weights = focus_from_results(dev)
    rows, rep = generate_task_pairs(ctx.cfg.tasks2, ctx.cfg.seed + 1, weights,
                                    avoid_names=heldout_names(ctx.cfg.bench))
    tasks, refs = heldout_tasks(ctx.cfg.bench, ctx.cfg.split)
    focused, split = decontaminate(rows, tasks, refs)
    old = [obj for _, obj in read_objects(ctx.path("data", "train.jsonl")) if not isinstance(obj, BadLine)]
    replay = random.Random(ctx.cfg.seed).sample(old, min(len(old), len(focused)))
    data2 = ctx.path("data2")
    data2.mkdir(parents=True, exist_ok=True)
    write_jsonl(data2 / "train.jsonl", [*focused, *replay])
    (data2 / "focus.json").write_text(json.dumps({"dev_metrics": dev["metrics"], "weights": weights,
                                                  "generated": rep.written, "heldout_split": split.to_json()},
                                                 indent=2) + "\n", encoding="utf-8")
    top = ", ".join(f"{k} {v:.1f}" for k, v in sorted(weights.items(), key=lambda kv: -kv[1])[:4])
    return (f"dev split: parse {dev['metrics']['nonempty_parse_rate']:.3f}, pass@1 {dev['metrics']['pass_at_1']:.3f}; "
            f"{len(focused)} focused pairs (most weight: {top}) + {len(replay)} replayed")


def train_round2(ctx: Context) -> str:
    return train(ctx, data="data2", run="run2", init_adapter=ctx.run_dir1)


def eval_tuned_round2(ctx: Context) -> str:
    return eval_tuned(ctx, run="run2")


def _default_gates() -> Path:
    from importlib import resources

    return Path(str(resources.files("mens.dogfood").joinpath("gates.yaml")))


def gate(ctx: Context) -> str:
    from mens.evaluate.gates import check_gates, describe

    if str(ctx.cfg.gates) == "none":
        return "no gates (--gates none)"
    try:
        results = check_gates(ctx.run, ctx.cfg.gates or _default_gates())
    except GateFailed as e:
        if not ctx.cfg.gate_enforced:
            return f"not met, not enforced with --quick (pass --gates FILE to enforce): {e}"
        raise
    missed = [r for r in results if not r.passed]
    if missed:  # MENS_EVAL_STRICT / VOX_EVAL_STRICT = 0: the gates only warn
        return "not met, not enforced (EVAL_STRICT=0): " + "; ".join(describe(r) for r in missed)
    return "passed: " + ", ".join(f"{r.gate} {r.value:.3f} >= {r.threshold:.2f}" for r in results)


def merge(ctx: Context) -> str:
    import shutil

    from mens.merge.merge import merge_adapter

    out = ctx.path("merged")
    if out.exists():  # a stage that failed half-way left it: the merge starts over
        shutil.rmtree(out)
    merge_adapter(ctx.run, out)
    return f"merged model -> {out}"


def parity(ctx: Context) -> str:
    """The gain survives the merge: the merged model (and, for the first tasks, the real server) give the same
    task results as the adapter, greedy, on the same prompts. Differences are recorded, not hidden."""
    from mens.dogfood.parity import compare_results, compare_served, greedy_results, served_answers
    from mens.evaluate.local import eval_local
    from mens.lang import get_language
    from mens.model.lora import has_adapter

    adapter = greedy_results(BenchmarkResults.read(ctx.run / BENCHMARK).to_json())
    if adapter is None:
        return "skipped: the tuned model was not evaluated greedily (add greedy to --modes)"
    # The adapter's answers that the merged model is shown to decode exactly (teacher forcing: one forward pass
    # each) are not decoded again; the rest are. As strict as decoding all, in about half its time.
    out = eval_local(ctx.path("merged"), str(ctx.path("bench", "heldout.jsonl")), language=LANGUAGE, modes=["greedy"],
                     split="all", limit=ctx.cfg.limit, max_new_tokens=ctx.cfg.max_new_tokens,
                     output=ctx.path("eval", "merged_results.json"), device=ctx.cfg.device,
                     progress=_progress(ctx, "merged"),
                     known_greedy={r["id"]: r["samples"][0]["output"] for r in adapter})
    merged_doc = BenchmarkResults.read(out).to_json()
    merge_cmp = compare_results(adapter, merged_doc["results"])
    merge_cmp["teacher_forced"] = merged_doc.get("greedy_adopted", 0)
    tasks = _bench_tasks(ctx)[: ctx.cfg.served_tasks]
    ctx.log(f"    served: asking `mens serve` for {len(tasks)} answers over HTTP")
    served = served_answers(ctx.path("merged"), tasks, ctx.cfg.max_new_tokens, ctx.cfg.device)
    served_cmp = compare_served(tasks, served, merged_doc["results"], get_language(LANGUAGE))
    parity_record = MergeParity(decoding="greedy", merged_vs_adapter=merge_cmp, served_vs_merged=served_cmp)
    parity_record.write(ctx.run / MERGE_PARITY)
    trained = "adapter" if has_adapter(ctx.run) else "trained weights"
    return (f"merged = {trained} on {merge_cmp['same_result']}/{merge_cmp['tasks']} task results "
            f"({merge_cmp['same_text']} identical answers, {merge_cmp['teacher_forced']} of them shown by teacher "
            f"forcing, the rest decoded); served = merged on {served_cmp['same_result']}/"
            f"{served_cmp['tasks']} ({served_cmp['same_text']} identical)")


def card(ctx: Context) -> str:
    from mens.report.card import write_card, write_merged_card
    from mens.report.html import write_report

    report = write_report(ctx.run)  # first: it draws the plots the card links to
    card_path = write_card(ctx.run)
    merged = ctx.path("merged")
    if merged.is_dir():  # the merged weights get their own card (library transformers, the merged files' usage)
        write_merged_card(ctx.run, merged)
    return f"card {card_path}, report {report}"
