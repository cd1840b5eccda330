"""`mens train`, `mens probe`, `mens status`: flags in, one function call, a short report out.

torch and transformers are imported inside the commands, so `mens --help` stays instant.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from mens.errors import UsageError


def register(app: typer.Typer) -> None:
    from mens.cli.train_options import train_command

    app.command("train")(train_command(train, TRAIN_DOC))
    app.command("probe")(probe)
    app.command("status")(status)


TRAIN_DOC = """Fine-tune a base model on train.jsonl (LoRA, QLoRA or full) and write a run directory.

Settings: defaults < --preset < CONFIG.yaml < key.sub=value < flags (docs/config.md); --print-config shows \
the result. Every run saves it as OUT/config.yaml: `mens train OUT/config.yaml output_dir=NEW` replays the run."""


def train(values: dict) -> int:
    """`mens train`: resolve the config from its layers, then print it, detach, or train (and gate)."""
    from mens.cli.train_options import OWN
    from mens.train.original_flags import FLAGS, translate
    from mens.train.resolve import require_paths, resolve_config, split_args

    file, overrides = split_args(values.pop("args") or [])
    own = {k: values.pop(k) for k in OWN}
    settings, record, notes = translate({f.key: values.pop(f.key) for f in FLAGS}, device=values.get("device"))
    flags = {**values, **settings, "extra": _pairs(values.get("extra"))}
    if record:
        flags["extra"] = {**(flags["extra"] or {}), "original_flags": record}
    cfg = resolve_config(file=file, overrides=overrides, flags=flags)
    for note in notes:
        typer.echo(f"note: {note}", err=True)
    if own["print_config"]:
        typer.echo(cfg.to_yaml(), nl=False)
        return 0
    require_paths(cfg)
    gate_args = [a for name, v in (("--gate", own["gate"]), ("--gate-bench", own["gate_bench"]),
                                   ("--gate-limit", own["gate_limit"])) if v is not None for a in (name, str(v))]
    if own["background"] or own["log_dir"] is not None:  # like the original, --log-dir alone also detaches
        from mens.train.background import relaunch

        pid, log = relaunch(cfg, own["log_dir"], gate_args)
        typer.echo(f"training in the background: pid {pid}, log {log}\nprogress: mens status {cfg.output_dir}")
        return 0
    from mens.train.run import run_training

    summary = run_training(cfg)
    if summary:
        typer.echo(f"done: {summary['steps']} steps, final loss {summary['final_loss']:.4f}, "
                   f"{summary['tokens_per_s']} tokens/s -> {cfg.output_dir}")
        from mens.evaluate.after_train import benchmark_requested, gate_after_training

        # rank 0 only (other ranks return no summary); the original's VOX_BENCHMARK=1 asks for it without --gate
        if own["gate"] is not None or benchmark_requested():
            verdict = gate_after_training(Path(cfg.output_dir), own["gate"], bench=own["gate_bench"],
                                          limit=own["gate_limit"], device=cfg.device)
            state = "passed" if verdict["passed"] else f"not met ({verdict['reason']})"
            typer.echo(f"gates {state} ({len(verdict['gates'])}); verdict recorded in gate_receipt.json")
    return 0


def _pairs(items: list[str] | None) -> dict | None:
    """`--extra KEY=VALUE` (repeatable) -> {KEY: VALUE}."""
    if not items:
        return None
    if bad := [i for i in items if "=" not in i]:
        raise UsageError(f"--extra {bad[0]!r}: expected KEY=VALUE")
    return dict(i.split("=", 1) for i in items)


def probe(
    model: str = typer.Option(None, "--model", help="Model to estimate memory for (local dir or embedded name)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or mps."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> int:
    """Report the device, its memory, the recommended preset and a training-memory estimate."""
    from mens.train.probe import probe_report

    model_dir = None
    if model:
        from mens.model.load import resolve_model

        model_dir, _ = resolve_model(model)
    rep = probe_report(model_dir, device)
    if as_json:
        typer.echo(json.dumps(rep, indent=2))
        return 0
    dev = rep["device"]
    typer.echo(f"device: {dev['kind']} ({dev['name']}), memory {dev.get('memory_gb')} GB, count {dev.get('count')}")
    typer.echo(f"recommended preset: {rep['recommended_preset']} {json.dumps(rep['preset'])}")
    if "estimate" in rep:
        e = rep["estimate"]
        typer.echo(f"estimate for {rep['model']}: ~{e['total_gb']} GB peak ({e['backend']}, {e['params_m']}M params)"
                   + ("" if "fits" not in e else ("; fits" if e["fits"] else "; does NOT fit")))
    typer.echo("preset by GPU memory" + (" (estimate for this model)" if "estimate" in rep else "") + ":")
    for row in rep["cards"]:
        est = "" if "estimate_gb" not in row else (f"  ~{row['estimate_gb']} GB {row['backend']}, "
                                                   + ("fits" if row["fits"] else "does NOT fit"))
        typer.echo(f"  {row['card_gb']:>4g} GB  {row['preset']:<14}{est}")
    return 0


def status(
    run: Path = typer.Argument(..., help="Run directory (the --output-dir of mens train)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> int:
    """Progress of a (background) training run, read from its telemetry.jsonl."""
    from mens.train.telemetry import run_status

    if not run.is_dir():
        raise UsageError(f"{run}: no such run directory; pass the --output-dir of `mens train`")
    s = run_status(run)
    if as_json:
        typer.echo(json.dumps(s, indent=2))
        return 0
    if s["state"] == "not started":
        typer.echo(f"{run}: no telemetry yet (not started, or still in preflight)")
        return 0
    loss = f"{s['loss']:.4f}" if isinstance(s.get("loss"), float) else "?"
    typer.echo(f"{run}: {s['state']} | step {s.get('step', 0)}/{s.get('total_steps', '?')} | loss {loss} | "
               f"tok/s {s.get('tokens_per_s', '?')} | eta {s.get('eta_s', '?')} s | val_loss {s.get('val_loss', '-')}")
    return 0
