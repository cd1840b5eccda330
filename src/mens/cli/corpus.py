"""`mens corpus …`: extract, validate, pairs, mix, eval, generate, repairs, requests. Each command parses flags,
calls one function of `mens.corpus`, prints its summary (stdout) — nothing else. No torch is imported.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

corpus_app = typer.Typer(help="Corpus tools: sources and docs -> validated training pairs (no torch).",
                         no_args_is_help=True)
LANG = typer.Option("vox", "--language", "-l", help="Language frontend (mens.lang).")


def register(app: typer.Typer) -> None:
    app.add_typer(corpus_app, name="corpus")


@corpus_app.command("extract")
def extract(
    paths: list[Path] = typer.Argument(None, help="Source files/folders and markdown docs (default: embedded)."),
    out: Path = typer.Option(..., "-o", "--output", help="units.jsonl; new units are added (the file is "
                             "re-created atomically with its previous rows)."),
    embedded: bool = typer.Option(False, "--embedded", help="Also extract the package's own example corpus."),
    rejects: Path = typer.Option(None, "--rejects", help="Files and units not extracted, with reasons "
                                 "(default OUT.rejects.jsonl)."),
    language: str = LANG,
) -> None:
    """Extract units (files, declarations, ANCHOR regions, doc blocks) with path, line span and sha256."""
    from mens.corpus.extract import embedded_root, extract_to_file

    roots = list(paths or [])
    if embedded and roots:
        roots.append(embedded_root(language))
    typer.echo(extract_to_file(roots, out, language, rejects).summary())


@corpus_app.command("validate")
def validate(
    inp: Path = typer.Argument(..., help="units.jsonl or train.jsonl."),
    out: Path = typer.Option(..., "-o", "--output", help="Records that pass."),
    rejects: Path = typer.Option(None, "--rejects", help="Rejected records with reasons (default OUT.rejects.jsonl)."),
    no_recheck: bool = typer.Option(False, "--no-recheck", help="Trust recorded parse verdicts; do not re-parse."),
    report: Path = typer.Option(None, "--report", help="Also write the reconciliation as JSON."),
    language: str = LANG,
) -> None:
    """Schema check, parse recheck, exact + normalized dedup; prints in = kept + rejected (by reason)."""
    from mens.corpus.atomic import write_text_atomic
    from mens.corpus.validate import validate_file

    rep = validate_file(inp, out, rejects, recheck=not no_recheck, language=language)
    if report:
        write_text_atomic(report, json.dumps(rep.to_json(), indent=2) + "\n")
    typer.echo(rep.summary())


@corpus_app.command("pairs")
def pairs(
    inp: Path = typer.Argument(..., help="Validated units (tool_trace rows and train pairs pass through)."),
    out: Path = typer.Option(..., "-o", "--output", help="train.jsonl (schema vox_dogfood_v1)."),
    docs: list[Path] = typer.Option(None, "--docs", help="Markdown folder for doc-context pairs (repeatable)."),
    seed: int = typer.Option(0, "--seed", help="Seed for the choice of phrasings."),
    phrasings: int = typer.Option(3, "--phrasings", min=1, help="Prompt phrasings per unit."),
    multi_turn: bool = typer.Option(False, "--multi-turn", help="Also emit multi-turn `messages` rows."),
    rejects: Path = typer.Option(None, "--rejects", help="Records that gave no pair, with reasons."),
    language: str = LANG,
) -> None:
    """Build instruction pairs: clean code responses (reparsed), natural prompts in several phrasings."""
    from mens.corpus.pairs import build_pairs

    typer.echo(build_pairs(inp, out, list(docs or []), seed, phrasings, multi_turn, rejects, language).summary())


@corpus_app.command("mix")
def mix(
    config: Path = typer.Option(..., "--config", "-c", help="mix.yaml (sources, weights, lanes, output)."),
    out: Path = typer.Option(None, "-o", "--output", help="Override the config's output path."),
    base: Path = typer.Option(None, "--base", help="Directory source paths are relative to (default: cwd)."),
    allow_missing: bool = typer.Option(False, "--allow-missing-sources", help="Skip missing/empty sources."),
) -> None:
    """Mix sources by weight into one JSONL plus `<stem>.mix_report.json`."""
    from mens.corpus.mix import mix_sources

    rep = mix_sources(config, out, base, allow_missing)
    for s in rep["sources"]:
        typer.echo(f"{s['path']}: weight {s['weight']} rows {s['emitted_lines']} share {s['share_of_output']:.1%}"
                   f"{' (' + s['skipped_reason'] + ')' if s['skipped_reason'] else ''}")
    typer.echo(f"total {rep['total_emitted']} -> {rep['output_path']}")


@corpus_app.command("eval")
def eval_(
    inp: Path = typer.Argument(..., help="train.jsonl (or validated units)."),
    out: Path = typer.Option(Path("eval_results.json"), "-o", "--output", help="Results JSON."),
    gates: Path = typer.Option(None, "--gates", help="Thresholds (eval-gates.yaml format); exit 1 on failure."),
    language: str = LANG,
) -> None:
    """Parse rate, non-empty parse rate, construct coverage, per-category counts; optional gates."""
    from mens.corpus.eval import eval_to_file

    r = eval_to_file(inp, out, gates, language)
    typer.echo(f"rows {r['total_samples']} (code {r['code_samples']}); parse rate {r['parse_rate']:.2%}, "
               f"non-empty {r['nonempty_parse_rate']:.2%}; coverage {r['construct_coverage']}/{r['construct_total']}"
               f" ({r['construct_coverage_pct']:.1f}%) -> {out}")


@corpus_app.command("generate")
def generate(
    out: Path = typer.Option(..., "-o", "--output", help="Synthetic train pairs JSONL."),
    limit: int = typer.Option(200, "--limit", "-n", help="Number of programs."),
    seed: int = typer.Option(0, "--seed", help="RNG seed (same seed, same output)."),
    tasks: bool = typer.Option(False, "--tasks", help="Task-shaped pairs (named decls, signatures, request words) "
                               "checked against their own expect, instead of the template programs."),
    focus: Path = typer.Option(None, "--focus", help="benchmark_results.json (mens eval-local): weight the task "
                               "categories that failed; implies --tasks."),
    language: str = LANG,
) -> None:
    """Synthetic programs with descriptions, from templates; every one is parse-checked."""
    if not (tasks or focus):
        from mens.corpus.generate import generate_to_file

        typer.echo(generate_to_file(out, limit, seed, language).summary())
        return
    from mens.corpus.taskgen import generate_tasks_to_file, load_focus
    from mens.evaluate.bench import heldout_names

    weights = load_focus(focus) if focus else None
    if weights:
        typer.echo("focus: " + ", ".join(f"{c} {w:g}" for c, w in sorted(weights.items(), key=lambda x: -x[1])))
    typer.echo(generate_tasks_to_file(out, limit, seed, weights, language,
                                      avoid_names=heldout_names()).summary())


@corpus_app.command("repairs")
def repairs(
    out: Path = typer.Option(..., "-o", "--output", help="Train pairs JSONL (schema vox_dogfood_v1)."),
    inp: Path = typer.Option(None, "-i", "--input", help="Train pairs JSONL whose answers are broken and fixed "
                             "(default: the shipped requests)."),
    limit: int = typer.Option(150, "--limit", "-n", min=1, help="Repair pairs to write at most."),
    seed: int = typer.Option(0, "--seed", help="RNG seed (same seed, same output)."),
    language: str = LANG,
) -> None:
    """Repair pairs: an answer's code broken by one edit the parser rejects (`def` for `fn`, a lost `}`...),
    asked to be fixed, answered with the original code."""
    from mens.corpus.repairs import repair_pairs_to_file

    typer.echo(f"{repair_pairs_to_file(out, inp, limit, seed, language).summary()} -> {out}")


@corpus_app.command("requests")
def requests(
    out: Path = typer.Option(..., "-o", "--output", help="Train pairs JSONL (schema vox_dogfood_v1)."),
    file: Path = typer.Option(None, "--file", help="Your own requests file (default: the shipped one)."),
    language: str = LANG,
) -> None:
    """Hand-written requests (id, category, prompt, expect, answer) as train pairs; every answer must parse and
    meet its own expect, or the command names the line and writes nothing."""
    from collections import Counter

    from mens.corpus.jsonl import write_jsonl
    from mens.corpus.requests import request_pairs

    rows = request_pairs(language, file)
    write_jsonl(out, rows)
    cats = Counter(r["category"].removeprefix(f"{language}_request_") for r in rows)
    typer.echo(f"{len(rows)} requests ({', '.join(f'{c} {n}' for c, n in cats.most_common())}) -> {out}")
