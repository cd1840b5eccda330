"""After training: `mens gate`, `mens report`, `mens card` (no torch); `mens publish` is in cli/publish.py."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    app.command("gate")(gate)
    app.command("report")(report)
    app.command("card")(card)


def gate(
    run: Path = typer.Argument(..., help="Run directory holding benchmark_results.json."),
    gates: Path | None = typer.Option(None, "--gates", help="Gate YAML (min_parse_rate, min_pass_at_1, ...)."),
) -> int:
    """Check a run's benchmark against promotion gates; exit 1 with a one-line reason when one fails."""
    from mens.evaluate.gates import check_gates, summary_lines
    from mens.run_records import GATE_RECEIPT

    for line in summary_lines(check_gates(run, gates)):
        typer.echo(line)
    typer.echo(f"receipt: {run / GATE_RECEIPT}")
    return 0


def report(run: Path = typer.Argument(..., help="Run directory.")) -> int:
    """Draw loss, throughput and before/after plots (RUN/plots/) and write RUN/report.html."""
    from mens.report.html import write_report

    typer.echo(f"wrote {write_report(run)}")
    return 0


def card(
    run: Path = typer.Argument(..., help="Run directory."),
    repo_id: str | None = typer.Option(None, "--repo-id", help="The Hub id the usage examples name (owner/name)."),
) -> int:
    """Write the Hugging Face model card RUN/README.md from the run's own results."""
    from mens.report.card import write_card

    typer.echo(f"wrote {write_card(run, repo_id=repo_id)}")
    return 0
