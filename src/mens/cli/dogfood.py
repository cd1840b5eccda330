"""`mens dogfood`: flags in, one call to `mens.dogfood.run_dogfood`, the headline numbers out."""

from __future__ import annotations

import math
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    app.command("dogfood")(dogfood)


def dogfood(
    output_dir: Path = typer.Option(Path("runs/dogfood"), "--output-dir", "-o", help="Where every stage writes."),
    model: str = typer.Option("smollm2-135m", "--model", help="Base model: embedded name, local HF dir or hub id."),
    corpus: list[Path] = typer.Option(None, "--corpus", help="Extra Vox sources/docs (repeatable), e.g. a checkout."),
    quick: bool = typer.Option(False, "--quick", help="A small version: 20 steps, 8 held-out tasks (minutes); the "
                                                      "preset mens/configs/dogfood/quick.yaml."),
    backend: str = typer.Option(None, "--backend", help="qlora, lora or full (default: the device preset's)."),
    preset: str = typer.Option(None, "--preset", help="Training preset (default: the device's, see `mens probe`)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    epochs: float = typer.Option(None, "--epochs", help="Training epochs (default: the preset's)."),
    max_steps: int = typer.Option(None, "--max-steps", help="Training steps (overrides --epochs)."),
    batch_size: int = typer.Option(None, "--batch-size", min=1, help="Training rows per step (default: preset's)."),
    lr: float = typer.Option(None, "--lr", help="Peak learning rate (default: the preset's)."),
    train: list[str] = typer.Option(None, "--train", help="A training override KEY=VALUE, keys as in `mens train` "
                                                          "(schedule.warmup_steps=20); repeatable, after the flags "
                                                          "above."),
    synthetic: int = typer.Option(None, "--synthetic", min=0,
                                   help="Synthetic programs to add (default 50; quick 40; 0 = none)."),
    tasks: int = typer.Option(None, "--tasks", min=0,
                               help="Task-shaped synthetic pairs to add (default 0 = none; quick 60)."),
    repairs: int = typer.Option(None, "--repairs", min=0,
                                 help="Repair pairs to add: a request's answer broken by one edit the parser "
                                      "rejects, asked to be fixed (default 0 = none)."),
    limit: int = typer.Option(None, "--limit", min=1, help="Evaluate only the first N held-out tasks."),
    max_new_tokens: int = typer.Option(None, "--max-new-tokens", min=1, help="Answer budget in eval (200; quick 128)."),
    modes: str = typer.Option("greedy,retry,constrained", "--modes", help="Decoding modes for the tuned model."),
    gates: str = typer.Option(None, "--gates", help="Gate YAML, or `none` (default: parse >= 0.80, gain >= 0.30)."),
    rounds: int = typer.Option(1, "--rounds", help="2: a second round aimed at what round 1 failed on the dev split."),
    dev_pairs: bool = typer.Option(None, "--dev-pairs/--no-dev-pairs",
                                   help="Train on the bench's dev split answers (default: yes, unless --rounds 2)."),
    renamed_dev: bool = typer.Option(False, "--renamed-dev/--no-renamed-dev",
                                     help="Rename the names in the dev split's repeated pairs, alike in request "
                                          "and answer (default: no)."),
    requests: bool = typer.Option(True, "--requests/--no-requests",
                                  help="Train on the shipped hand-written requests (default: yes)."),
    served_tasks: int = typer.Option(None, "--served-tasks", min=1,
                                     help="Held-out prompts also sent to the real server in the parity stage "
                                          "(default 8, quick 2; a number >= the held-out count sends all)."),
    seed: int = typer.Option(0, "--seed", help="Seed for phrasings, synthetic data and the mix."),
    resume: bool = typer.Option(False, "--resume", help="Continue a run in --output-dir, skipping finished stages."),
    budget: str = typer.Option(None, "--budget", help="Wall-clock budget for the whole run (30m, 1h, none): "
                                                      "training gets the steps that fit, timed on this machine by a "
                                                      "few probe steps. Default 30m (none with --quick, --rounds 2, "
                                                      "--epochs or --max-steps); none trains the whole recipe."),
) -> int:
    """Run the whole pipeline on the embedded Vox corpus: data, held-out bench, base eval, train, eval, gate,
    merge, model card and report."""
    from mens.dogfood import DogfoodConfig, run_dogfood
    from mens.run_records import DOGFOOD_SUMMARY
    from mens.train.resolve import flags_layer, merge, parse_overrides

    overrides = merge(flags_layer({"backend": backend, "preset": preset, "epochs": epochs, "max_steps": max_steps,
                                   "batch_size": batch_size, "learning_rate": lr}),
                      parse_overrides(train or [], "--train"))
    cfg = DogfoodConfig(output_dir=output_dir, model=model, corpus=list(corpus or []), quick=quick, device=device,
                        train=overrides, synthetic=synthetic, tasks=tasks, repairs=repairs, limit=limit,
                        max_new_tokens=max_new_tokens,
                        modes=tuple(m.strip() for m in modes.split(",") if m.strip()),
                        gates=None if gates is None else Path(gates), rounds=rounds, seed=seed,
                        dev_pairs=dev_pairs, renamed_dev=renamed_dev, requests=requests, served_tasks=served_tasks,
                        resume=resume, budget=budget)
    s = run_dogfood(cfg)
    typer.echo(f"base model:  non-empty parse rate {_f(s['base']['nonempty_parse_rate'])}, "
               f"pass@1 {_f(s['base']['pass_at_1'])}")
    for mode, m in s["tuned"].items():
        typer.echo(f"tuned {mode:12s} non-empty parse rate {_f(m['nonempty_parse_rate'])}, pass@1 {_f(m['pass_at_1'])}")
    typer.echo(f"gate: {gate_verdict(s['gate'], enforced=cfg.gate_enforced)}; "
               f"{s['total_stage_seconds']:.0f} s in stages")
    if line := budget_line(s.get("budget"), cfg.budget):
        typer.echo(line)
    typer.echo(f"card {s['card']}\nreport {s['report']}\nmerged {s['merged']}")
    typer.echo(f"summary {output_dir / DOGFOOD_SUMMARY}")
    return 0


def budget_line(cut: dict | None, budget: str | None) -> str | None:
    """Where the budget cut the recipe: how much of it trained, and what the whole recipe would cost here."""
    if not cut or not cut.get("whole_recipe_s"):
        return None
    pace = f", {cut['step_s']:.1f} s a step on this machine" if cut.get("step_s") else ""
    return (f"budget {budget}: trained {cut['steps']} of the recipe's {cut['recipe_steps']} steps{pace}; the "
            f"whole recipe would take about {math.ceil(cut['whole_recipe_s'] / 60)} min here (--budget none), and "
            "the scores rise with the steps (docs/dogfood.md)")


def gate_verdict(passed: bool | None, *, enforced: bool) -> str:
    """The summary's gate line. A --quick smoke run (20 steps) records an unmet packaged gate without stopping."""
    if passed is None:
        return "not run"
    if passed:
        return "passed"
    return "FAILED" if enforced else "not met (not enforced in a --quick smoke run; see the card)"


def _f(v) -> str:
    return "-" if v is None else f"{v:.3f}"
