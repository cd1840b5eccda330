"""`mens chat RUN|MERGED`: a terminal chat with a trained model, answers streamed as they are decoded."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

MIN_TEMPERATURE = 1e-6
"""Below this a temperature underflows the sampling maths; it picks the most likely token anyway (greedy)."""


def register(app: typer.Typer) -> None:
    app.command("chat")(chat)


def chat(
    path: Path = typer.Argument(..., help="Run directory (base + adapter) or merged/model directory."),
    constrained: str | None = typer.Option(None, "--constrained", help="Constrain every answer to a language: vox."),
    max_new_tokens: int = typer.Option(512, "--max-new-tokens", min=1, help="Longest answer, in tokens."),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="0 is greedy; higher samples."),
    top_p: float = typer.Option(1.0, "--top-p", min=0.0, max=1.0),
    seed: int | None = typer.Option(None, "--seed", help="Seed for sampling (temperature > 0)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
) -> int:
    """Chat in the terminal with the trained system prompt. Each line read from stdin is a message (piping works);
    /reset forgets the conversation, /exit or end of input quits."""
    from mens.model.chat import ChatSession
    from mens.model.inference import load_for_inference

    constraint = None
    if constrained:
        from mens.lang import get_language
        from mens.model.constraint import language_constraint

        constraint = language_constraint(get_language(constrained))  # a bad name fails before the model loads
    interactive = sys.stdin.isatty()
    if interactive:
        typer.echo(f"loading {path} ...", err=True)
    loaded = load_for_inference(path, device=device)
    session = ChatSession(loaded, constraint=constraint, max_new_tokens=max_new_tokens,
                          temperature=0.0 if temperature < MIN_TEMPERATURE else temperature, top_p=top_p, seed=seed)
    if interactive:
        prompt = loaded.system_prompt or "(none: the tokenizer's chat template decides)"
        typer.echo(f"{loaded.model_id} ({loaded.kind}); system prompt: {prompt}\n"
                   f"{'answers constrained to ' + constrained + '; ' if constrained else ''}"
                   "/reset forgets the conversation, /exit or Ctrl-D quits", err=True)
    while True:
        if interactive:
            sys.stderr.write(">>> ")
            sys.stderr.flush()
        line = sys.stdin.readline()
        if not line:  # end of input
            break
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit", "/bye"):
            break
        if text == "/reset":
            session.reset()
            continue
        for piece in session.ask(text):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()
    return 0
