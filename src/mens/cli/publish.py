"""`mens publish RUN|MERGED --repo-id ID`: upload a model with its card, results and plots to the Hugging Face Hub."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    app.command("publish")(publish)


def publish(
    path: Path = typer.Argument(..., help="Run directory (publishes the adapter) or merged directory (the weights)."),
    repo_id: str = typer.Option(..., "--repo-id", help="Hub repository, owner/name (created when missing)."),
    private: bool = typer.Option(False, "--private", help="Create the repository private."),
    dry_run: Path | None = typer.Option(None, "--dry-run", help="Write the folder that would be uploaded to this new "
                                                                "directory and stop (no token, no network)."),
    run: Path | None = typer.Option(None, "--run", help="The run whose results describe a merged directory "
                                                        "(default: the run named in its hand-off file)."),
    dataset: list[str] = typer.Option([], "--dataset", help="A Hub dataset id the model was trained on (repeatable)."),
    gguf: Path | None = typer.Option(None, "--gguf", help="Also publish a `mens export --gguf` output directory (its "
                                                          "GGUF and Modelfile) or one .gguf file."),
) -> int:
    """Publish a model to the Hugging Face Hub: weights, tokenizer and chat template, model card, results, plots."""
    from mens.report.publish import card_problems, check_repo_id, stage_folder
    from mens.report.publish import publish as upload

    check_repo_id(repo_id)
    if dry_run is not None:
        files = stage_folder(path, dry_run, repo_id=repo_id, run=run, datasets=dataset, gguf=gguf)
        problems = card_problems(dry_run / "README.md")
        for f in files:
            typer.echo(f"  {f}")
        typer.echo(f"wrote {len(files)} files to {dry_run} (nothing uploaded)")
        for p in problems:
            typer.echo(f"warning: model card: {p}", err=True)
        return 1 if problems else 0
    url = upload(path, repo_id, private=private, run=run, datasets=dataset, gguf=gguf, log=typer.echo)
    typer.echo(f"published {url}")
    return 0
