"""`mens train`, `mens probe`, `mens status`: flags in, one function call, a short report out.

torch and transformers are imported inside the commands, so `mens --help` stays instant.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from mens.errors import UsageError


def register(app: typer.Typer) -> None:
    app.command("train")(train)
    app.command("probe")(probe)
    app.command("status")(status)


def train(
    data_dir: Path = typer.Option(..., "--data-dir", help="Directory with train.jsonl, or a .jsonl file."),
    output_dir: Path = typer.Option(..., "--output-dir", help="Run directory to write."),
    model: str = typer.Option(None, "--model", help="Local HF dir, hub id, or embedded `smollm2-135m` (default)."),
    backend: str = typer.Option(None, "--backend", help="qlora (default), lora or full."),
    preset: str = typer.Option(None, "--preset", help="Preset name (see `mens probe`); default: the device's."),
    device: str = typer.Option(None, "--device", help="auto (default), cpu, cuda or mps."),
    epochs: float = typer.Option(None, "--epochs", help="Passes over the data."),
    max_steps: int = typer.Option(None, "--max-steps", help="Optimizer steps (overrides --epochs)."),
    seq_len: int = typer.Option(None, "--seq-len", help="Max tokens per row (left truncation)."),
    batch_size: int = typer.Option(None, "--batch-size", help="Rows per micro-batch per process."),
    grad_accum: int = typer.Option(None, "--grad-accum", help="Micro-batches per optimizer step."),
    lr: float = typer.Option(None, "--lr", help="Peak learning rate."),
    rank: int = typer.Option(None, "--rank", help="LoRA rank."),
    alpha: float = typer.Option(None, "--alpha", help="LoRA alpha."),
    ce_last_k: int = typer.Option(None, "--ce-last-k", help="Supervise only the last K tokens (0 = all)."),
    pack: bool = typer.Option(None, "--pack/--no-pack", help="Pack several examples per row."),
    val_fraction: float = typer.Option(None, "--val-fraction", help="Held-out share for validation loss."),
    eval_every: int = typer.Option(None, "--eval-every", help="Validation every N steps (0 = at the end)."),
    save_every: int = typer.Option(None, "--save-every", help="Checkpoint every N steps (0 = none)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint."),
    background: bool = typer.Option(False, "--background", help="Detach; log to --log-dir."),
    log_dir: Path = typer.Option(None, "--log-dir", help="Log directory; implies --background (default OUT/logs)."),
    seed: int = typer.Option(None, "--seed", help="Random seed."),
    lora_dropout: float = typer.Option(None, "--lora-dropout", help="LoRA dropout."),
    neftune_alpha: float = typer.Option(None, "--neftune-alpha", help="NEFTune embedding noise while training "
                                        "(0 = off; the paper used 5-15)."),
    lora_layers: int = typer.Option(None, "--lora-layers", help="Adapt only the top N decoder layers (0 = all)."),
    min_examples: int = typer.Option(None, "--min-examples", help="Fewest usable examples accepted."),
    strict_targets: bool = typer.Option(None, "--strict-targets/--no-strict-targets",
                                        help="Fail when a decoder-layer projection would stay unadapted."),
    threads: int = typer.Option(None, "--threads", help="torch CPU threads (0 = default)."),
    autocast: str = typer.Option(None, "--autocast", help="Matmul precision: auto (default), bf16 or off (f32)."),
    fsdp: str = typer.Option(None, "--fsdp", help="Shard across torchrun processes: auto (when a replica would "
                             "not fit; default), on or off."),
    gradient_checkpointing: bool = typer.Option(None, "--gradient-checkpointing/--no-gradient-checkpointing",
                                                help="Recompute activations in backward (less memory)."),
    system_prompt: str = typer.Option(None, "--system-prompt", help="System prompt ('' = none; default: Vox)."),
    init_adapter: Path = typer.Option(None, "--init-adapter", help="Start LoRA from this run's adapter (round 2)."),
    gate: Path = typer.Option(None, "--gate", help="After training: eval-local + these gates (verdict in manifest)."),
    gate_bench: str = typer.Option(None, "--gate-bench", help="Bench for --gate (default: vox_default, held-out)."),
    gate_limit: int = typer.Option(None, "--gate-limit", help="Evaluate only the first N held-out tasks for --gate."),
) -> int:
    """Fine-tune a base model on train.jsonl (LoRA, QLoRA or full) and write a run directory."""
    flags = {"data": str(data_dir), "output_dir": str(output_dir), "model": model, "backend": backend,
             "device": device, "epochs": epochs, "max_steps": max_steps, "seq_len": seq_len,
             "batch_size": batch_size, "grad_accum": grad_accum, "learning_rate": lr, "r": rank, "lora_alpha": alpha,
             "ce_last_k": ce_last_k, "pack": pack, "val_fraction": val_fraction, "eval_every": eval_every,
             "save_every": save_every, "resume": resume or None, "seed": seed, "lora_dropout": lora_dropout,
             "lora_layers": lora_layers, "neftune_alpha": neftune_alpha,
             "min_examples": min_examples, "strict_targets": strict_targets, "num_threads": threads,
             "autocast": autocast, "fsdp": fsdp,
             "system_prompt": system_prompt, "gradient_checkpointing": gradient_checkpointing,
             "init_adapter": None if init_adapter is None else str(init_adapter)}
    if background or log_dir is not None:  # like the original, --log-dir alone also detaches
        from mens.train.background import spawn_background

        argv = ["train", "--data-dir", str(data_dir), "--output-dir", str(output_dir)]
        for name, value in (("--preset", preset), *[(f"--{k.replace('_', '-')}", v) for k, v in flags.items()
                                                       if k not in ("data", "output_dir")]):
            argv += _flag(name, value)
        for name, value in (("--gate", gate), ("--gate-bench", gate_bench), ("--gate-limit", gate_limit)):
            argv += _flag(name, value)
        pid, log = spawn_background(argv, log_dir or output_dir / "logs")
        typer.echo(f"training in the background: pid {pid}, log {log}\nprogress: mens status {output_dir}")
        return 0
    from mens.train.config import resolve_config
    from mens.train.presets import canonical_name, load_preset

    name = preset
    if name is None:
        from mens.train.presets import recommend_preset
        from mens.train.probe import probe_device

        dev = probe_device(device or "auto")
        name = recommend_preset(dev["kind"], dev.get("memory_gb"))
    cfg = resolve_config(flags, load_preset(name), canonical_name(name))
    cfg.preset = canonical_name(name)
    from mens.train.run import run_training

    summary = run_training(cfg)
    if summary:
        typer.echo(f"done: {summary['steps']} steps, final loss {summary['final_loss']:.4f}, "
                   f"{summary['tokens_per_s']} tokens/s -> {output_dir}")
        if gate is not None:  # rank 0 only: other ranks return no summary
            from mens.evaluate.after_train import gate_after_training

            verdict = gate_after_training(output_dir, gate, bench=gate_bench, limit=gate_limit,
                                          device=cfg.device)
            typer.echo(f"gates passed ({len(verdict['gates'])}); verdict recorded in training_manifest.json")
    return 0


def _flag(name: str, value) -> list[str]:
    if value is None:
        return []
    if name == "--learning-rate":
        name = "--lr"
    elif name == "--r":
        name = "--rank"
    elif name == "--lora-alpha":
        name = "--alpha"
    elif name == "--num-threads":
        name = "--threads"
    elif name == "--data":
        name = "--data-dir"
    if isinstance(value, bool):
        if name == "--resume":
            return [name] if value else []
        base = name[2:]
        return [f"--{base}" if value else f"--no-{base}"]
    return [name, str(value)]


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
