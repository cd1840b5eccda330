"""`mens card RUN`: a Hugging Face model card (README.md with YAML metadata) from the run's own files.

Numbers come only from the run's artifacts (benchmark_results.json, run_summary.json, manifest,
gate_receipt.json); what was not measured is said to be missing, never invented.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from mens.evaluate.passk import wilson_interval
from mens.model.lora import has_adapter
from mens.report.runfiles import RunFiles, read_run


def _fmt(v) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def _peak(peak) -> str:
    if isinstance(peak, dict):
        return ", ".join(f"{k} {v}" for k, v in peak.items()) or "not measured"
    return "not measured" if peak is None else str(peak)


def _metadata(files: RunFiles) -> dict:
    m = files.manifest
    meta = {
        "base_model": m.get("base_model_id") or m.get("base_model") or "unknown",
        "library_name": "peft" if m.get("backend") in ("lora", "qlora") else "transformers",
        "license": m.get("license", "apache-2.0"),
        "tags": ["mens", "code", "vox", *(["lora"] if m.get("backend") in ("lora", "qlora") else []),
                 *(["qlora"] if m.get("backend") == "qlora" else [])],
        "pipeline_tag": "text-generation",
    }
    if m.get("data_files") or m.get("data"):
        meta["datasets"] = [str(x) for x in (m.get("data_files") or [m.get("data")])]
    metrics = files.bench.get("metrics")
    if metrics:
        meta["model-index"] = [{
            "name": files.run.name,
            "results": [{
                "task": {"type": "text-generation", "name": "code generation"},
                "dataset": {"name": str(files.bench.get("bench", "bench")), "type": "mens-bench"},
                "metrics": [
                    {"type": "nonempty_parse_rate", "name": "non-empty parse rate",
                     "value": metrics.get("nonempty_parse_rate")},
                    {"type": "pass@1", "name": "task pass@1", "value": metrics.get("pass_at_1")},
                ],
            }],
        }]
    return meta


def _results_section(files: RunFiles) -> list[str]:
    bench = files.bench
    if not bench.get("metrics"):
        return ["## Results", "", "Not evaluated yet: run `mens eval-local RUN --bench B --compare-base`.", ""]
    rows = []
    if bench.get("base", {}).get("metrics"):
        rows.append(("base model (greedy)", bench["base"]["metrics"]))
    for name, m in (bench.get("modes") or {"tuned": bench["metrics"]}).items():
        rows.append((f"tuned ({name})", m))
    lines = ["## Results", "", f"Bench: `{bench.get('bench', '?')}`, {bench['metrics'].get('tasks', '?')} tasks, "
             f"k = {bench.get('k', 1)} sample(s) per task.", "",
             "| model | non-empty parse rate | task pass@1 | pass@k | construct coverage |", "|---|---|---|---|---|"]
    for name, m in rows:
        lines.append(f"| {name} | {_fmt(m.get('nonempty_parse_rate'))} | {_fmt(m.get('pass_at_1'))} | "
                     f"{_fmt(m.get('pass_at_k'))} | {_fmt(m.get('coverage'))} |")
    lines += _intervals(rows)
    fails = bench["metrics"].get("failures_by_category") or {}
    if fails:
        lines += ["", "Remaining failures (first reason per failing sample): "
                  + ", ".join(f"{k} {v}" for k, v in fails.items()) + "."]
    return [*lines, ""]


def _intervals(rows: list[tuple[str, dict]]) -> list[str]:
    """95% intervals of the tuned greedy row's rates, where each is a count of tasks (one answer per task)."""
    name, m = next(((n, m) for n, m in rows if n.startswith("tuned")), (None, {}))
    tasks = m.get("tasks")
    if not isinstance(tasks, int) or tasks <= 0 or m.get("samples", tasks) != tasks:
        return []
    parts = []
    for key, label in (("nonempty_parse_rate", "non-empty parse"), ("pass_at_1", "task pass@1")):
        rate = m.get(key)
        if not isinstance(rate, (int, float)) or abs(rate * tasks - round(rate * tasks)) > 0.01:
            continue
        hits = round(rate * tasks)
        lo, hi = wilson_interval(hits, tasks)
        parts.append(f"{label} {hits} of {tasks}, {lo:.2f}-{hi:.2f}")
    if not parts:
        return []
    return ["", f"95% intervals of the {name} rates (Wilson): {'; '.join(parts)}. Two runs whose rates fall inside "
            "each other's intervals are not shown apart by this bench."]


def _gates_section(run: Path) -> list[str]:
    receipt = run / "gate_receipt.json"
    if not receipt.is_file():
        return ["## Gates", "", "No gate was run for this model.", ""]
    doc = json.loads(receipt.read_text(encoding="utf-8"))
    lines = ["## Gates", "", f"Overall: {'passed' if doc.get('overall_passed') else 'FAILED'}.", "",
             "| gate | threshold | value | passed |", "|---|---|---|---|"]
    for g in doc.get("gates", []):
        lines.append(f"| {g['gate']} | {g['threshold']} | {_fmt(g['value'])} | {'yes' if g['passed'] else 'no'} |")
    return [*lines, ""]


def _sample_size_limit(bench: dict) -> list[str]:
    metrics = bench.get("metrics") or {}
    cats = metrics.get("per_category") or {}
    sizes = [c["tasks"] for c in cats.values() if isinstance(c, dict) and isinstance(c.get("tasks"), int)]
    if not sizes:
        return []
    smallest = min(sizes)
    return [f"- The bench is small: {metrics.get('tasks')} tasks in {len(cats)} categories, as few as {smallest} "
            "in a category, so one task moves a category's score a lot; read per-category numbers as a sketch."]


def _dogfood_data(cfg: dict) -> list[str]:
    """Where a `mens dogfood` run's data came from, and what the held-out split removed from it."""
    root = (cfg.get("extra") or {}).get("dogfood")
    if not root:
        return []
    mix = Path(root) / "corpus" / "mixed.mix_report.json"
    split = Path(root) / "data" / "heldout_split.json"
    lines = []
    if mix.is_file():
        names = {"pairs.jsonl": "pairs from the corpus's programs and declarations",
                 "synthetic.jsonl": "synthetic programs (templates, every one parsed)",
                 "tasks.jsonl": "task-shaped pairs (a request naming kind, name and signature; each answer "
                                "checked against exactly that)",
                 "bench_dev.jsonl": "rows from the bench's dev split (its hand-written tasks and reference "
                                    "answers, each 3 times; the held-out split is a different set of tasks)",
                 "requests.jsonl": "hand-written requests in users' words (each answer parsed and checked like a "
                                   "bench task)",
                 "train.jsonl": "round-1 rows and focused task pairs"}
        for src in json.loads(mix.read_text(encoding="utf-8")).get("sources", []):
            lines.append(f"- {src['emitted_lines']} {names.get(Path(src['path']).name, src['path'])}")
    if split.is_file():
        doc = json.loads(split.read_text(encoding="utf-8"))
        lines.append(f"- held out: {doc['heldout_tasks']} bench tasks no training row overlaps; {doc['dropped']} rows "
                     "were dropped because their code equals a held-out answer (normalized) or their prompt nearly "
                     f"copies a held-out prompt (word 3-gram Jaccard >= {doc['prompt_near_dup_threshold']})")
    return [*lines, ""] if lines else []


def _parity_section(run: Path) -> list[str]:
    """What `mens dogfood` measured after the merge: the merged model and the server against the adapter."""
    path = run / "merge_parity.json"
    if not path.is_file():
        return []
    doc = json.loads(path.read_text(encoding="utf-8"))
    m, s = doc.get("merged_vs_adapter", {}), doc.get("served_vs_merged", {})
    trained = "the adapter" if has_adapter(run) else "the trained weights"
    lines = ["## After the merge", "",
             f"The merged model gives the same task result as {trained} on {m.get('same_result')} of "
             f"{m.get('tasks')} held-out tasks ({m.get('same_text')} answers identical; greedy, same prompts); "
             f"`mens serve` on the merged model gives the same result on {s.get('same_result')} of {s.get('tasks')} "
             f"({s.get('same_text')} identical)."]
    if m.get("different_result"):
        lines.append(f"Tasks whose result changed in the merge: {', '.join(m['different_result'])}.")
    return [*lines, ""]


def build_card(run_dir: str | Path) -> str:
    files = read_run(run_dir)
    m, s = files.manifest, files.summary
    cfg = m.get("config") or {}
    ex = m.get("examples") or {}
    cfg_rows = "\n".join(f"| {k} | {v} |" for k, v in sorted(cfg.items()) if not isinstance(v, (dict, list)))
    parts = [
        "---", yaml.safe_dump(_metadata(files), sort_keys=False).strip(), "---", "",
        f"# {files.run.name}", "",
        f"A code assistant for Vox, fine-tuned by mens from `{_metadata(files)['base_model']}` "
        f"({m.get('backend', 'unknown')} backend). It answers requests with Vox code; the numbers below "
        "come from this run's own benchmark and say how often that code parses and does what was asked.", "",
        "## Data", "",
        f"Training file sha256 `{m.get('data_sha256', '?')}`; {ex.get('train', '?')} training and "
        f"{ex.get('val', '?')} validation examples.", "",
        *_dogfood_data(cfg),
        "## Training", "",
        f"{s.get('steps', '?')} optimizer steps, final loss {_fmt(s.get('final_loss', '?'))}, "
        f"{s.get('tokens_per_s', '?')} tokens/s, {s.get('wall_time_s', '?')} s, "
        f"peak memory {_peak(s.get('peak_memory'))}.", "",
        *(["| setting | value |", "|---|---|", cfg_rows, ""] if cfg_rows else []),
        *_results_section(files),
        *_gates_section(files.run),
        *_parity_section(files.run),
        "## Limits", "",
        "- Parsing is checked with mens's Vox frontend (upstream parser parity); it does not type-check or run "
        "the code.",
        "- The bench covers declaration kinds, names, parameters and required contents; it does not execute "
        "programs or judge style, and it has few multi-file or UI-behaviour tasks.",
        *_sample_size_limit(files.bench),
        "- A small base model: expect simple programs, and check what it writes.", "",
        "## How to use", "",
        "```bash", f"mens serve {files.run} --port 8000            # OpenAI- and Ollama-compatible API",
        f"mens serve {files.run} --constrained vox      # every answer parses",
        f"mens merge {files.run} -o merged/             # plain Hugging Face model directory", "```", "",
    ]
    return "\n".join(parts)


def write_card(run_dir: str | Path) -> Path:
    out = Path(run_dir) / "README.md"
    out.write_text(build_card(run_dir), encoding="utf-8")
    return out
