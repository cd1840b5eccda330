"""`mens pretrain`: train the Vox lab model from scratch (lab tokenizer + small Llama-architecture model)."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    app.command("pretrain")(pretrain)


def pretrain(
    paths: list[Path] = typer.Argument(..., help="Vox source files or folders (searched recursively)."),
    output: Path = typer.Option(..., "--output-dir", "-o", help="Where the Hugging Face model directory goes."),
    steps: int = typer.Option(300, "--steps", min=1),
    seq_len: int = typer.Option(256, "--seq-len", min=8),
    batch_size: int = typer.Option(16, "--batch-size", min=1),
    lr: float = typer.Option(3e-3, "--lr"),
    d_model: int = typer.Option(128, "--d-model", min=8),
    n_layers: int = typer.Option(4, "--layers", min=1),
    seed: int = typer.Option(0, "--seed"),
) -> int:
    """Pretrain the lab model on Vox source; report its loss and the share of its outputs that parse."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from mens.train.pretrain import PretrainConfig
    from mens.train.pretrain import pretrain as run

    cfg = PretrainConfig(steps=steps, seq_len=seq_len, batch_size=batch_size, lr=lr, d_model=d_model,
                         n_layers=n_layers, seed=seed)
    columns = [TextColumn("pretrain"), BarColumn(),
               TextColumn("{task.completed}/{task.total} loss {task.fields[loss]}"), TimeRemainingColumn()]
    with Progress(*columns, transient=True) as bar:
        task = bar.add_task("pretrain", total=steps, loss="?")
        summary = run(paths, output, cfg, progress=lambda i, n, loss: bar.update(task, completed=i, loss=f"{loss:.3f}"))
    typer.echo(f"loss {summary['initial_loss']:.3f} -> {summary['final_loss']:.3f} (val {summary['val_loss']:.3f}); "
               f"{summary['parse_share']:.0%} of generated declarations parse; model: {output}")
    return 0
